"""kv.create('local'/'device') and the API's argument handling."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from trainer_core import kv
from trainer_core.errors import CompressionError, ConfigError, KVError


def test_local_store_api() -> None:
    store = kv.create("local")
    assert (store.rank, store.num_workers, store.type) == (0, 1, "local")
    store.init(["a", 3], [np.zeros((2, 2)), np.ones(3, np.float32)])
    store.push("a", [np.ones((2, 2)), np.ones((2, 2))])
    out = np.empty((2, 2))
    store.pull("a", out)
    assert out.tolist() == [[2, 2], [2, 2]]
    v = np.full(3, 5, np.float32)
    store.pushpull(3, v)
    assert v.tolist() == [5, 5, 5]
    store.set_optimizer({"type": "sgd", "learning_rate": 0.5})
    outs = [np.empty(3, np.float32), np.empty(3, np.float32)]
    store.pushpull([3], [np.ones(3, np.float32)], [outs])
    assert outs[0].tolist() == outs[1].tolist() == [4.5] * 3
    store.barrier()
    store.set_gradient_compression({"type": "none"})


def test_errors() -> None:
    store = kv.create("device")
    with pytest.raises(ConfigError, match="unknown KV store type"):
        kv.create("dist_magic")
    with pytest.raises(KVError, match="not initialized"):
        store.pull("x", np.empty(1))
    with pytest.raises(KVError, match="ints or strings"):
        store.init(1.5, np.zeros(1))  # type: ignore[arg-type]
    with pytest.raises(KVError, match=r"list of 2 keys, which needs a list of 2 values .*got a list of 1"):
        store.init([1, 2], [np.zeros(1)])
    with pytest.raises(CompressionError, match="unknown compression type 'zip'"):
        store.set_gradient_compression({"type": "zip"})
    with pytest.raises(CompressionError):
        store.set_gradient_compression("2bit")


def test_a_tuple_key_with_one_value_is_told_it_is_a_list_of_keys() -> None:
    store = kv.create("local")
    with pytest.raises(KVError) as told:
        store.init((1, 2), np.zeros(3))
    message = str(told.value)
    assert "keys (1, 2) are taken as a list of 2 keys" in message
    assert "got one ndarray of shape (3,)" in message and "a key is one int or string" in message
    with pytest.raises(KVError, match="key 'k': its value is missing"):
        store.init("k", None)


@pytest.mark.parametrize("kind", ["local", "device"])
def test_a_pull_into_an_output_of_the_wrong_size_names_the_key(kind: str) -> None:
    store = kv.create(kind)
    store.init("w", np.zeros(4, np.float32))
    with pytest.raises(KVError) as told:
        store.pull("w", np.empty(3, np.float32))
    assert str(told.value).startswith("key 'w': the output has 3 elements (shape (3,)), the key's value 4")
    with pytest.raises(KVError, match=r"^key 'w': the output has 2 elements"):
        store.pull("w", [np.empty(4, np.float32), np.empty(2, np.float32)])


def test_local_store_server_state_round_trip_and_refusals() -> None:
    """The local store's state is the server store's (one part): checked whole before any change."""
    store = kv.create("local")
    store.set_optimizer({"type": "adam", "learning_rate": 0.1})
    store.set_gradient_compression({"type": "2bit", "threshold": 0.5})
    store.init(["w", 7], [np.zeros((2, 3), np.float32), np.arange(4, dtype=np.int32)])
    store.pushpull("w", np.ones((2, 3), np.float32), np.empty((2, 3), np.float32))
    state = store.server_state()
    assert sorted(state["w"]) == ["opt/m", "opt/t", "opt/v", "value"]  # pulls of weights: whole
    assert state["w"]["value"].shape == state["w"]["opt/m"].shape == (2, 3) and state["w"]["opt/t"] == 1
    assert sorted(state[7]) == ["value"] and state[7]["value"].tolist() == [0, 1, 2, 3]
    before = state["w"]["value"].copy()
    bad: list[tuple[dict[Any, dict[str, Any]], str]] = [
        ({"w": {"value": np.ones(5, np.float32)}}, "does not fit"),  # wrong size
        ({"w": {"opt/mom": np.ones(6, np.float32)}}, "does not fit"),  # not an Adam slot
        ({"w": {"pull/1/residual": np.ones(6, np.float32)}}, "one part"),
        ({"w": {"residual": np.ones(6, np.float32)}}, "does not fit"),  # no such slot
        ({"w": {"value": np.ones(6, np.float32)}, 7: {"value": np.ones(3, np.int32)}}, "does not fit"),
        ({"x": {"value": np.ones(6, np.float32)}}, "not initialized"),
    ]
    for given, match in bad:
        with pytest.raises(KVError, match=match):
            store.load_server_state(given)
        np.testing.assert_array_equal(store.server_state()["w"]["value"], before)
    store.load_server_state({"w": {**state["w"], "value": before + 1}, 7: {"value": np.full(4, 9, np.int32)}})
    again = store.server_state()
    np.testing.assert_array_equal(again["w"]["value"], before + 1)
    np.testing.assert_array_equal(again["w"]["opt/v"], state["w"]["opt/v"])
    assert again[7]["value"].tolist() == [9] * 4
    store.push("w", np.ones((2, 3), np.float32))
    assert store.server_state()["w"]["opt/t"] == 2  # Adam goes on from the restored step count


@pytest.mark.parametrize(
    ("out", "said"),
    [
        (3, "a value is an array (numpy, or cupy on a GPU) or a list of arrays, one per device, not int 3"),
        (
            "w",
            "a value is an array (numpy, or cupy on a GPU) or a list of arrays, one per device, not str 'w'",
        ),
        (np.broadcast_to(np.zeros(1, np.float32), (3,)), "read-only"),
    ],
    ids=["int", "str", "read-only"],
)
def test_a_pull_into_what_is_not_a_writable_array_names_the_key(out: Any, said: str) -> None:
    """Before: AttributeError 'float' object has no attribute 'size', or numpy's "assignment
    destination is read-only", neither naming the key."""
    store = kv.create("local")
    store.init("w", np.zeros(3, np.float32))
    with pytest.raises(KVError, match="key 'w': ") as info:
        store.pull("w", out=out)
    assert said in str(info.value)


@pytest.mark.parametrize("value", [[1, 2, 3], (1.0, 2.0), [np.zeros(3, np.float32), 5], []])
def test_a_list_value_is_one_array_per_device(value: Any) -> None:
    """``init("w", [1, 2, 3])`` was taken as three per-device values: the key held 1 element, the
    first; a pull into a list of floats was an AttributeError on 'size'."""
    store = kv.create("local")
    with pytest.raises(
        KVError,
        match=r"key 'w': a value is an array \(numpy, or cupy on a GPU\) or a list of arrays, one per device, not ",
    ):
        store.init("w", value)
    store.init("w", np.zeros(3, np.float32))
    with pytest.raises(KVError, match="key 'w': a value is an array"):
        store.push("w", value)
    with pytest.raises(KVError, match="key 'w': a value is an array"):
        store.pull("w", out=[0.0, 0.0, 0.0])
