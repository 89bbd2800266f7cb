"""kv.create('local'/'device') and the API's argument handling."""

from __future__ import annotations

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
    with pytest.raises(KVError, match="same length"):
        store.init([1, 2], [np.zeros(1)])
    with pytest.raises(CompressionError, match="unsupported gradient compression type 'zip'"):
        store.set_gradient_compression({"type": "zip"})
    with pytest.raises(CompressionError):
        store.set_gradient_compression("2bit")
