"""What the KV store's entry points accept as a value (kv/api.py ``normalize``, every store type):
an array, or a list of arrays (one per device); a Python number or list is a ``TypeError`` saying
so (it was an ``AttributeError``, or a wrong element count when a list of numbers was read as one
value per device)."""

from __future__ import annotations

import numpy as np
import pytest

from trainer_core import kv as kvmod


@pytest.mark.parametrize("value", [3.0, 5, [1.0, 2.0], [[1.0, 2.0]], (1.0, 2.0)], ids=repr)
@pytest.mark.parametrize("call", ["init", "push", "pull", "pushpull"])
def test_a_python_number_or_list_where_an_array_belongs_is_a_type_error(call, value):
    kv = kvmod.create("local")
    kv.init("w", np.zeros(2, np.float32))
    fn = {
        "init": lambda: kv.init("v", value),
        "push": lambda: kv.push("w", value),
        "pull": lambda: kv.pull("w", out=value),
        "pushpull": lambda: kv.pushpull("w", value),
    }[call]
    with pytest.raises(
        TypeError, match=r"key '[wv]': a value is an array \(numpy, or cupy on a GPU\) or a list"
    ):
        fn()


def test_arrays_and_lists_of_arrays_are_accepted():
    kv = kvmod.create("local")
    kv.init(["a", "b"], [np.zeros(2, np.float32), np.zeros(3)])
    kv.push("a", [np.ones(2, np.float32), np.ones(2, np.float32)])
    outs = [np.empty(2, np.float32), np.empty(2, np.float32)]
    kv.pull("a", out=outs)
    assert [o.tolist() for o in outs] == [[2.0, 2.0]] * 2
