"""Distributed learners: update equations against references on small arrays.

The multi-worker cases run N threads over ``FakeKV``, a small in-process stand-in for a
``dist_sync`` KV store with the same public API (``init`` keeps rank 0's values, ``pushpull``
returns the sum of the round's pushes); ``run_workers(n, fn)`` runs ``fn(kv)`` per rank. The async
learner runs over the real single-process ``local`` store (its server-side optimizer).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from trainer_core import kv as kvstore
from trainer_core.optim.local import get_learner
from trainer_core.train.comm import KVCommunicator
from trainer_core.train.learners import (
    AsyncSGDLearner,
    async_sgd_distributed_learner,
    block_momentum_distributed_learner,
    block_momentum_time_constant,
    compression_for_bits,
    data_parallel_distributed_learner,
    model_averaging_distributed_learner,
    server_optimizer_spec,
)


class FakeGroup:
    def __init__(self, n: int) -> None:
        self.n = n
        self.bar = threading.Barrier(n, timeout=20)
        self.lock = threading.Lock()
        self.store: dict[Any, np.ndarray] = {}
        self.acc: dict[Any, np.ndarray] = {}
        self.calls: list[tuple[int, str, Any]] = []


def _pairs(keys: Any, values: Any) -> list[tuple[Any, Any]]:
    if isinstance(keys, list | tuple):
        return list(zip(keys, values, strict=True))
    return [(keys, values)]


class FakeKV:
    type = "dist_sync"

    def __init__(self, group: FakeGroup, rank: int) -> None:
        self.group, self.rank, self.num_workers = group, rank, group.n
        self.compression: dict[str, Any] | None = None
        self.closed = False

    def _log(self, op: str, arg: Any = None) -> None:
        with self.group.lock:
            self.group.calls.append((self.rank, op, arg))

    def init(self, keys: Any, values: Any) -> None:
        self._log("init")
        if self.rank == 0:
            for k, v in _pairs(keys, values):
                self.group.store[k] = np.array(v, copy=True)
        self.group.bar.wait()

    def pull(self, keys: Any, outs: Any) -> Any:
        self._log("pull")
        for k, o in _pairs(keys, outs):
            o[...] = self.group.store[k].reshape(o.shape)
        self.group.bar.wait()
        return outs

    def pushpull(self, keys: Any, values: Any, outs: Any = None) -> Any:
        self._log("pushpull")
        g = self.group
        with g.lock:
            for k, v in _pairs(keys, values):
                g.acc[k] = g.acc[k] + v if k in g.acc else np.array(v, copy=True)
        g.bar.wait()
        if self.rank == 0:
            for k, _ in _pairs(keys, values):
                g.store[k] = g.acc.pop(k)
        g.bar.wait()
        target = values if outs is None else outs
        for k, o in _pairs(keys, target):
            o[...] = g.store[k].reshape(o.shape)
        g.bar.wait()
        return target

    def push(self, keys: Any, values: Any) -> None:
        self.pushpull(keys, values, [np.empty_like(v) for _, v in _pairs(keys, values)])

    def barrier(self) -> None:
        self.group.bar.wait()

    def set_gradient_compression(self, params: Any) -> None:
        self._log("set_gradient_compression", dict(params))
        self.compression = dict(params)
        self.group.bar.wait()

    def set_optimizer(self, spec: Any) -> None:
        raise NotImplementedError("the fake has no server-side optimizer")

    def close(self) -> None:
        self.closed = True


def run_workers(n: int, fn: Callable[[FakeKV], Any]) -> list[Any]:
    """Run ``fn(kv)`` on ``n`` threads sharing one fake store; results (or the first error) by rank."""
    group = FakeGroup(n)
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def body(rank: int) -> None:
        try:
            results[rank] = fn(FakeKV(group, rank))
        except BaseException as exc:
            errors.append(exc)
            group.bar.abort()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if errors:
        raise errors[0]
    assert not any(t.is_alive() for t in threads), "a worker thread did not finish within 30 s"
    return results


# -- helpers ---------------------------------------------------------------------------------------
SHAPES = {"W": (3, 2), "b": (2,)}


def make_params(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([seed, 99])
    return {k: rng.standard_normal(s) for k, s in SHAPES.items()}


def grad(rank: int, step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([rank, step, 7])
    return {k: rng.standard_normal(s) for k, s in SHAPES.items()}


def copy(p: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v.copy() for k, v in p.items()}


def mean(ps: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.sum([p[k] for p in ps], axis=0) / len(ps) for k in ps[0]}


def assert_params(got: dict[str, np.ndarray], want: dict[str, np.ndarray], rtol: float = 1e-10) -> None:
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=rtol, atol=1e-12, err_msg=k)


LOCAL_KW: dict[str, dict[str, Any]] = {
    "sgd": {"lr": 0.1},
    "momentum": {"lr": 0.1, "momentum": 0.5},
    "nesterov": {"lr": 0.1, "momentum": 0.5},
    "adam": {"lr": 0.01},
}


# -- data parallel ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(LOCAL_KW))
def test_data_parallel_averages_gradients_then_local_step(name: str) -> None:
    n, steps = 3, 4

    def worker(kv: FakeKV) -> tuple[dict[str, np.ndarray], list[bool]]:
        params = make_params(kv.rank)  # different start: distributed_after=0 takes rank 0's
        dl = data_parallel_distributed_learner(get_learner(name, params, **LOCAL_KW[name]), kv=kv)
        synced = [dl.update(grad(kv.rank, s), 8) for s in range(steps)]
        assert dl.total_number_of_samples_seen == 8 * steps
        return params, synced

    results = run_workers(n, worker)
    ref = make_params(0)
    ref_learner = get_learner(name, ref, **LOCAL_KW[name])
    for s in range(steps):
        ref_learner.update(mean([grad(r, s) for r in range(n)]))
    for params, synced in results:
        assert synced == [True] * steps
        assert_params(params, ref)


def test_data_parallel_warm_start_trains_locally_then_averages() -> None:
    n, steps, lr = 2, 5, 0.1

    def worker(kv: FakeKV) -> tuple[dict[str, np.ndarray], list[bool], list[str]]:
        params = make_params(kv.rank)
        dl = data_parallel_distributed_learner(get_learner("sgd", params, lr=lr), 16, 1, kv=kv)
        synced = [dl.update(grad(kv.rank, s), 8) for s in range(steps)]
        ops = [op for r, op, _ in kv.group.calls if r == kv.rank]
        return params, synced, ops

    results = run_workers(n, worker)
    local = [make_params(r) for r in range(n)]
    for r in range(n):
        for s in range(2):  # 16 samples of warm start
            for k in SHAPES:
                local[r][k] -= lr * grad(r, s)[k]
    ref = mean(local)
    for s in range(2, steps):
        g = mean([grad(r, s) for r in range(n)])
        for k in SHAPES:
            ref[k] -= lr * g[k]
    for params, synced, ops in results:
        assert synced == [False, False, True, True, True]
        # the averaging exchange travels before compression is turned on
        assert (
            ops == ["init", "pushpull"] + ["init", "pushpull", "set_gradient_compression"] + ["pushpull"] * 3
        )
        assert_params(params, ref)


@pytest.mark.parametrize(
    ("bits", "kw", "want"),
    [
        (1, {}, {"type": "1bit"}),
        (2, {"threshold": 0.02}, {"type": "2bit", "threshold": 0.02}),
        (32, {}, None),
        (32, {"compression": {"type": "topk", "ratio": 0.01}}, {"type": "topk", "ratio": 0.01}),
    ],
)
def test_quantization_bits_turn_on_kv_compression_after_the_initial_pull(
    bits: int, kw: dict[str, Any], want: dict[str, Any] | None
) -> None:
    def worker(kv: FakeKV) -> tuple[dict[str, Any] | None, list[str]]:
        params = make_params(kv.rank)
        data_parallel_distributed_learner(
            get_learner("sgd", params, lr=0.1), num_quantization_bits=bits, kv=kv, **kw
        )
        return kv.compression, [op for r, op, _ in kv.group.calls if r == kv.rank]

    for compression, ops in run_workers(2, worker):
        assert compression == want
        # the communicator's host exchange, the keys, rank 0's values, then compression
        assert ops == ["init", "pushpull", "init", "pull"] + (["set_gradient_compression"] if want else [])


def test_compression_for_bits_rejects_other_widths() -> None:
    assert compression_for_bits(32) is None
    with pytest.raises(ValueError, match="num_quantization_bits"):
        compression_for_bits(8)


# -- block momentum / model averaging ----------------------------------------------------------------
def bmuf_reference(
    n: int,
    steps: int,
    period: int,
    eta: float,
    zeta: float,
    nesterov: bool,
    reset: bool,
    mu: float,
    lr: float,
) -> dict[str, np.ndarray]:
    """Chen and Huo's BMUF written out with both iterates kept: the filtered model ``big_w``
    (``W(t) = W(t-1) - v``) and the block's start ``prev`` (``W(t) - eta v`` with Nesterov, the
    paper's NBM, else ``W(t)``); ``v = eta v + zeta (1-eta) N mean_i(prev - w_i)``."""
    prev = make_params(0)
    big_w = copy(prev)
    v = {k: np.zeros(s) for k, s in SHAPES.items()}
    ws = [copy(prev) for _ in range(n)]
    moms = [{k: np.zeros(s) for k, s in SHAPES.items()} for _ in range(n)]
    count = 0
    for s in range(steps):
        for r in range(n):
            g = grad(r, s)
            for k in SHAPES:
                moms[r][k] = mu * moms[r][k] + g[k]
                ws[r][k] = ws[r][k] - lr * moms[r][k]
        count += 1
        if count == period or s == steps - 1:
            g_mean = mean([{k: prev[k] - w[k] for k in SHAPES} for w in ws])
            for k in SHAPES:
                v[k] = eta * v[k] + (1 - eta) * zeta * n * g_mean[k]
                big_w[k] = big_w[k] - v[k]
                prev[k] = big_w[k] - eta * v[k] if nesterov else big_w[k].copy()
            ws = [copy(prev) for _ in range(n)]
            if reset:
                moms = [{k: np.zeros(s) for k, s in SHAPES.items()} for _ in range(n)]
            count = 0
    return prev


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("reset", [True, False])
def test_block_momentum_matches_reference(nesterov: bool, reset: bool) -> None:
    n, steps, block_size, mu, lr = 3, 7, 9, 0.5, 0.1  # 3 samples per worker per block

    def worker(kv: FakeKV) -> tuple[dict[str, np.ndarray], list[bool], bool, float]:
        params = make_params(kv.rank)
        local = get_learner("momentum", params, lr=lr, momentum=mu)
        dl = block_momentum_distributed_learner(
            local,
            block_size,
            use_nestrov_momentum=nesterov,
            reset_sgd_momentum_after_aggregation=reset,
            kv=kv,
        )
        synced = [dl.update(grad(kv.rank, s), 1) for s in range(steps)]
        return params, synced, dl.flush(), dl.block_momentum

    results = run_workers(n, worker)
    eta = 1 - 1 / n
    ref = bmuf_reference(n, steps, 3, eta, 1.0, nesterov, reset, mu, lr)
    for params, synced, flushed, bm in results:
        assert bm == pytest.approx(eta)
        assert synced == [False, False, True, False, False, True, False]
        assert flushed
        assert_params(params, ref)


def test_block_momentum_default_is_the_papers_mean_form() -> None:
    """With eta = 1 - 1/N, CNTK's (1 - eta) * sum equals the paper's mean."""
    n, steps = 4, 4

    def worker(kv: FakeKV) -> dict[str, np.ndarray]:
        params = make_params(kv.rank)
        dl = block_momentum_distributed_learner(get_learner("sgd", params, lr=0.1), 8, kv=kv)
        for s in range(steps):
            dl.update(grad(kv.rank, s), 1)
        return params

    results = run_workers(n, worker)
    prev, v = make_params(0), {k: np.zeros(s) for k, s in SHAPES.items()}
    big_w = copy(prev)  # the filtered model; prev is the look-ahead each block starts from
    eta = 0.75
    for block in range(2):
        ws = []
        for r in range(n):
            w = copy(prev)
            for s in (2 * block, 2 * block + 1):
                for k in SHAPES:
                    w[k] -= 0.1 * grad(r, s)[k]
            ws.append(w)
        g = mean([{k: prev[k] - w[k] for k in SHAPES} for w in ws])
        for k in SHAPES:
            v[k] = eta * v[k] + g[k]
            big_w[k] = big_w[k] - v[k]
            prev[k] = big_w[k] - eta * v[k]
    for params in results:
        assert_params(params, prev)


def test_start_if_due_ends_the_warm_start_once() -> None:
    n = 2

    def worker(kv: FakeKV) -> list[bool]:
        params = make_params(kv.rank)
        dl = block_momentum_distributed_learner(
            get_learner("sgd", params, lr=0.1), 4, distributed_after=2, kv=kv
        )
        seen = [dl.start_if_due()]
        for s in range(3):
            dl.update(grad(kv.rank, s), 1)
            seen.append(dl.start_if_due())
        return seen

    for seen in run_workers(n, worker):
        assert seen == [False, False, True, False]


def test_block_momentum_time_constant() -> None:
    n, block_size, tc = 2, 6, 20.0

    def worker(kv: FakeKV) -> tuple[dict[str, np.ndarray], float]:
        params = make_params(kv.rank)
        dl = block_momentum_distributed_learner(
            get_learner("momentum", params, lr=0.1, momentum=0.5),
            block_size,
            tc,
            block_learning_rate=0.7,
            kv=kv,
        )
        for s in range(6):
            dl.update(grad(kv.rank, s), 1)
        return params, dl.block_momentum

    results = run_workers(n, worker)
    eta = math.exp(-block_size / tc)
    assert block_momentum_time_constant(eta, block_size) == pytest.approx(tc)
    ref = bmuf_reference(n, 6, 3, eta, 0.7, True, True, 0.5, 0.1)
    for params, bm in results:
        assert bm == pytest.approx(eta)
        assert_params(params, ref)


def test_block_momentum_with_one_worker_is_local_sgd() -> None:
    kv = kvstore.create("local")
    params, ref = make_params(0), make_params(0)
    dl = block_momentum_distributed_learner(get_learner("sgd", params, lr=0.1), 4, kv=kv)
    assert dl.block_momentum == 0.0
    for s in range(10):
        dl.update(grad(0, s), 1)
        for k in SHAPES:
            ref[k] -= 0.1 * grad(0, s)[k]
    dl.flush()
    assert_params(params, ref)


def test_model_averaging_averages_every_sync_period_and_keeps_local_momentum() -> None:
    n, steps, mu, lr = 3, 5, 0.5, 0.1

    def worker(kv: FakeKV) -> dict[str, np.ndarray]:
        params = make_params(kv.rank)
        dl = model_averaging_distributed_learner(
            get_learner("momentum", params, lr=lr, momentum=mu), 2, kv=kv
        )
        for s in range(steps):
            dl.update(grad(kv.rank, s), 1)
        dl.flush()
        return params

    results = run_workers(n, worker)
    ws = [make_params(0) for _ in range(n)]
    moms = [{k: np.zeros(s) for k, s in SHAPES.items()} for _ in range(n)]
    for s in range(steps):
        for r in range(n):
            for k in SHAPES:
                moms[r][k] = mu * moms[r][k] + grad(r, s)[k]
                ws[r][k] -= lr * moms[r][k]
        if s % 2 == 1 or s == steps - 1:
            avg = mean(ws)
            ws = [copy(avg) for _ in range(n)]
    for params in results:
        assert_params(params, ws[0])


def test_periodic_learner_validation() -> None:
    kv = kvstore.create("local")
    with pytest.raises(ValueError, match="time_constant"):
        block_momentum_distributed_learner(get_learner("sgd", make_params(), lr=0.1), 4, -1.0, kv=kv)
    with pytest.raises(ValueError, match="distributed_after"):
        data_parallel_distributed_learner(get_learner("sgd", make_params(), lr=0.1), -1, kv=kv)

    def worker(kv: FakeKV) -> None:
        block_momentum_distributed_learner(get_learner("sgd", make_params(), lr=0.1), 1, kv=kv)

    with pytest.raises(ValueError, match="block_size"):
        run_workers(2, worker)


# -- async SGD through the parameter server ----------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "kw"),
    [
        ("sgd", {"lr": 0.1, "weight_decay": 0.01}),
        ("momentum", {"lr": 0.1, "momentum": 0.9}),
        ("momentum", {"lr": 0.1, "momentum": 0.9, "unit_gain": True}),
        ("nesterov", {"lr": 0.1, "momentum": 0.9}),
        ("nesterov", {"lr": 0.1, "momentum": 0.9, "unit_gain": True, "weight_decay": 0.01}),
        ("adam", {"lr": 0.01}),
        ("adam", {"lr": 0.01, "eps": 1e-2, "weight_decay": 0.01}),  # epsilon's place shows
    ],
)
def test_async_learner_runs_the_local_rule_on_the_server(name: str, kw: dict[str, Any]) -> None:
    kv = kvstore.create("local")
    params = {k: v.astype(np.float64) for k, v in make_params(0).items()}
    ref = copy(params)
    dl = async_sgd_distributed_learner(get_learner(name, params, **kw), kv=kv)
    assert isinstance(dl, AsyncSGDLearner)
    ref_learner = get_learner(name, ref, **kw)
    for s in range(6):
        assert dl.update(grad(0, s), 4)
        ref_learner.update(grad(0, s))
    assert_params(params, ref)  # the same rules (optim.rules) on both sides


def test_async_learner_takes_a_kv_communicator_as_the_other_learners() -> None:
    kv = kvstore.create("local")
    params = make_params(0)
    dl = async_sgd_distributed_learner(get_learner("sgd", params, lr=0.1), communicator=KVCommunicator(kv))
    assert isinstance(dl, AsyncSGDLearner) and dl.kv is kv
    with pytest.raises(ValueError, match=r"either kv= .* or communicator="):
        async_sgd_distributed_learner(get_learner("sgd", params, lr=0.1))


def test_async_learner_warm_start_then_server_steps() -> None:
    kv = kvstore.create("local")
    params, ref = make_params(0), make_params(0)
    dl = async_sgd_distributed_learner(get_learner("sgd", params, lr=0.1), 8, kv=kv)
    synced = [dl.update(grad(0, s), 4) for s in range(5)]
    assert synced == [False, False, True, True, True]
    for s in range(5):
        for k in SHAPES:
            ref[k] -= 0.1 * grad(0, s)[k]
    assert_params(params, ref)


def test_server_optimizer_spec() -> None:
    p = make_params()
    assert server_optimizer_spec(get_learner("sgd", p, lr=0.5), 0.25) == {
        "type": "sgd",
        "learning_rate": 0.5,
        "wd": 0.0,
        "rescale_grad": 0.25,
    }
    spec = server_optimizer_spec(get_learner("momentum", p, lr=0.5, momentum=0.9, unit_gain=True))
    assert spec["learning_rate"] == pytest.approx(0.05)
    assert spec["momentum"] == 0.9 and spec["nesterov"] is False
    assert server_optimizer_spec(get_learner("nesterov", p, lr=0.5))["nesterov"] is True
    assert server_optimizer_spec(get_learner("adam", p))["type"] == "adam"


def test_async_buffered_parameter_update_is_refused_as_in_cntk() -> None:
    kv = kvstore.create("local")
    with pytest.raises(ValueError, match="use_async_buffered_parameter_update"):
        data_parallel_distributed_learner(get_learner("sgd", make_params(), lr=0.1), 0, 32, True, kv=kv)


def test_one_bit_data_parallel_over_the_local_store_matches_the_compressors() -> None:
    """The local store compresses pushes (worker residual) and pulls (server residual)."""
    from trainer_core.compression import get_compressor

    kv = kvstore.create("local")
    params = {k: v.astype(np.float32) for k, v in make_params(0).items()}
    ref = copy(params)
    dl = data_parallel_distributed_learner(get_learner("momentum", params, lr=0.1), 0, 1, kv=kv)
    ref_learner = get_learner("momentum", ref, lr=0.1)
    wc = {k: get_compressor({"type": "1bit"}) for k in SHAPES}
    sc = {k: get_compressor({"type": "1bit"}) for k in SHAPES}
    for s in range(5):
        g = {k: v.astype(np.float32) for k, v in grad(0, s).items()}
        dl.update(g, 4)
        pulled = {}
        for k in SHAPES:
            pushed = wc[k].decode(*wc[k].encode(g[k]), g[k].shape, np.float32)
            pulled[k] = sc[k].decode(*sc[k].encode(pushed), g[k].shape, np.float32)
        ref_learner.update(pulled)
    assert_params(params, ref, rtol=1e-6)


def test_a_learner_without_kv_or_communicator_is_told_neither_was_given() -> None:
    """It said "..., not both" when neither was given."""
    kv = kvstore.create("local")
    local = get_learner("sgd", make_params(0), lr=0.1)
    with pytest.raises(ValueError, match="neither was given") as info:
        data_parallel_distributed_learner(local)
    assert "not both" not in str(info.value)
    with pytest.raises(ValueError, match="both were given"):
        data_parallel_distributed_learner(local, kv=kv, communicator=KVCommunicator(kv))


@pytest.mark.parametrize("make", [data_parallel_distributed_learner, async_sgd_distributed_learner])
def test_kv_that_is_not_a_store_is_named(make: Callable[..., Any]) -> None:
    """``kv="dist_sync"`` (the store's type for the store) was an AttributeError on num_workers."""
    with pytest.raises(
        TypeError, match=r"kv= takes a KV store.*got str 'dist_sync'.*kv\.create\('dist_sync'\)"
    ):
        make(get_learner("sgd", make_params(0), lr=0.1), kv="dist_sync")


def test_update_names_the_gradients_it_lacks() -> None:
    """A missing gradient was a bare KeyError, a list of them a TypeError on indices."""
    params = make_params(0)
    dl = data_parallel_distributed_learner(get_learner("sgd", params, lr=0.1), kv=kvstore.create("local"))
    with pytest.raises(ValueError, match=r"no gradient for parameter\(s\) \['b'\]"):
        dl.update({"W": grad(0, 0)["W"]}, 4)
    with pytest.raises(TypeError, match="expected a dict of the gradients by parameter name, got list"):
        dl.update(list(grad(0, 0).values()), 4)
    before = {k: v.copy() for k, v in params.items()}
    assert dl.update(grad(0, 0), 4) and not np.array_equal(params["W"], before["W"])
