"""Checkpoints of the servers' state: optimizer slots and pull residuals, fetched and restored.

The distributed cases run real jobs: 2 workers, 2 servers, a server-side optimizer and 1-bit
compressed pushes (the weights are pulled whole), or no optimizer and 1-bit compression in both
directions (the servers' pull residuals saved too). A job trains ``K`` steps, checkpoints (the servers' state, rank 0's
file, worker 1's residual file) and trains on to ``N``; a NEW job resumes from the checkpoint and
must end with bit-identical values, as must a third job that never checkpoints.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.trainer_core.cluster import Job, run_job, worker_script
from trainer_core import kv as kvstore
from trainer_core.errors import KVError, WireError
from trainer_core.ps import protocol as wire
from trainer_core.ps import store as store_mod
from trainer_core.train import checkpoint

K, N = 3, 6
COMP = {"type": "1bit", "block_size": 512}

BODY = """
from trainer_core.train import checkpoint
cfg = json.loads(os.environ['TEST_CFG'])
path, mode, K, N = cfg['path'], cfg['mode'], cfg['k'], cfg['n']
if cfg['spec']:
    kv.set_optimizer(cfg['spec'])
kv.set_gradient_compression(cfg['comp'])
shapes = {'w': (60, 50), 'b': (7,)}
params = {k: np.linspace(-1, 1, int(np.prod(s)), dtype=np.float32).reshape(s) for k, s in shapes.items()}
start = 0
if mode == 'resume':
    ck = checkpoint.load(path)
    checkpoint.restore_params(params, ck)
    start = ck.step
kv.init(list(shapes), [params[k] for k in shapes])
if mode == 'resume':
    checkpoint.restore_server(kv, ck)
    kv.load_compression_state(ck.residuals if kv.rank == 0 else checkpoint.load_worker(path, kv.rank, ck.step))
for step in range(start, N):
    rng = np.random.default_rng([kv.rank, step])
    grads = [0.1 * params[k] + rng.standard_normal(shapes[k]).astype(np.float32) for k in shapes]
    kv.pushpull(list(shapes), grads, [params[k] for k in shapes])
    if mode == 'first' and step + 1 == K:
        server = kv.server_state()
        if kv.rank == 0:
            checkpoint.save(path, params=params, residuals=kv.compression_state(), server_state=server,
                            step=K, compression=cfg['comp'])
            emit(slots={str(k): sorted(v) for k, v in server.items()})
        else:
            checkpoint.save_worker(path, kv.rank, kv.compression_state(), step=K)
        kv.barrier()
emit(final={k: v.ravel().tolist() for k, v in params.items()})
"""


def assert_clean(job: Job) -> None:
    assert all(code == 0 for code in job.codes().values()), job.outputs()
    assert job.leftover_shm == [], job.leftover_shm


def finals(job: Job) -> list[dict[str, Any]]:
    assert_clean(job)
    return [w.results()[-1]["final"] for w in job.workers]


@pytest.mark.slow  # three jobs of five processes each
@pytest.mark.parametrize(
    "spec",
    [
        {"type": "sgd", "learning_rate": 0.05, "momentum": 0.9, "wd": 0.001},
        {"type": "adam", "learning_rate": 0.01},
        None,  # the servers sum: what is pulled is compressed, with the servers' residuals
    ],
)
def test_dist_resume_is_bit_identical(spec: dict[str, Any] | None, tmp_path: Path) -> None:
    path = str(tmp_path / "ck.npz")
    env = {"MXNET_KVSTORE_BIGARRAY_BOUND": "1000"}  # 'w' (3000 values) is split over both servers

    def job(mode: str) -> Job:
        cfg = {"path": path, "mode": mode, "k": K, "n": N, "spec": spec, "comp": COMP}
        return run_job(worker_script(BODY), 2, 2, {**env, "TEST_CFG": json.dumps(cfg)})

    first = job("first")
    through = finals(first)
    slots = first.workers[0].results()[0]["slots"]
    kind = spec["type"] if spec else None
    opt = {"adam": ["opt/m", "opt/t", "opt/v"], "sgd": ["opt/mom"], None: []}[kind]
    pulled = [] if spec else ["pull/0/residual", "pull/1/residual"]  # weights are pulled whole
    assert slots["w"] == sorted(["value", *pulled, *opt])
    assert slots["b"] == sorted(["value", *pulled[:1], *opt])
    ck = checkpoint.load(path)
    assert ck.step == K and not ck.not_saved
    if kind == "adam":
        assert ck.server["w"]["opt/t"] == K and isinstance(ck.server["w"]["opt/t"], int)
    if not spec:
        assert np.abs(ck.server["w"]["pull/1/residual"]).max() > 0
    assert Path(checkpoint.worker_path(path, 1)).exists()
    resumed = finals(job("resume"))
    straight = finals(job("straight"))
    for got in (*through, *resumed):
        for k in straight[0]:
            assert got[k] == straight[0][k]  # bit for bit (JSON floats round-trip exactly)


def run_local(ck: checkpoint.Checkpoint | None, steps: range) -> tuple[kvstore.KVStore, np.ndarray]:
    kv = kvstore.create("local")
    kv.set_optimizer({"type": "adam", "learning_rate": 0.01})
    kv.set_gradient_compression(COMP)
    w = np.linspace(-1, 1, 1500, dtype=np.float32)
    if ck is not None:
        w[...] = ck.params["w"]
    kv.init("w", w)
    if ck is not None:
        checkpoint.restore_server(kv, ck)
        kv.load_compression_state(ck.residuals)
    for s in steps:
        g = 0.1 * w + np.random.default_rng(s).standard_normal(w.size).astype(np.float32)
        kv.pushpull("w", g, w)
    return kv, w


def test_local_store_resume_is_bit_identical(tmp_path: Path) -> None:
    _, straight = run_local(None, range(N))
    kv, w = run_local(None, range(K))
    state = kv.server_state()
    assert sorted(state["w"]) == ["opt/m", "opt/t", "opt/v", "value"]  # the weights are pulled whole
    path = checkpoint.save(
        tmp_path / "ck.npz", params={"w": w}, residuals=kv.compression_state(), server_state=state, step=K
    )
    ck = checkpoint.load(path)
    assert ck.server["w"]["opt/t"] == K
    _, resumed = run_local(ck, range(K, N))
    np.testing.assert_array_equal(resumed, straight)


def test_checkpoint_keeps_int_keys_and_worker_files(tmp_path: Path) -> None:
    server = {3: {"value": np.ones(4, np.float32), "opt/t": 2}, "3": {"value": np.zeros(2)}}
    path = checkpoint.save(tmp_path / "ck.npz", params={}, server_state=server, step=5)
    ck = checkpoint.load(path)
    assert set(ck.server) == {3, "3"} and ck.server[3]["opt/t"] == 2
    np.testing.assert_array_equal(ck.server[3]["value"], np.ones(4, np.float32))
    res = {"w/0": {"residual": np.arange(3, dtype=np.float32)}}
    checkpoint.save_worker(path, 2, res, step=5)
    assert checkpoint.worker_path(path, 2).name == "ck.worker2.npz"
    np.testing.assert_array_equal(
        checkpoint.load_worker(path, 2, 5)["w/0"]["residual"], res["w/0"]["residual"]
    )
    with pytest.raises(ValueError, match="step 5"):
        checkpoint.load_worker(path, 2, 6)


def _store_with_key() -> store_mod.Store:
    st = store_mod.Store(num_workers=2)
    st.set_optimizer({"type": "sgd", "learning_rate": 0.1, "momentum": 0.9})
    init = wire.Header(op=wire.INIT, entries=(wire.Entry("k", 0, 8, "<f4"),), body={"rank": 0})
    st.handle(store_mod.Request(b"", init, 0, [np.zeros(8, np.float32)], [None]))
    return st


def test_store_refuses_bad_state_and_open_rounds() -> None:
    st = _store_with_key()
    e = wire.Entry("k", 0, 8, "<f4")
    st.set_state((e,), [np.ones(8, np.float32)], ["opt/mom"], [])
    _, arrays, slots, scalars = st.get_state()
    assert slots == ["value", "opt/mom"] and scalars == []
    np.testing.assert_array_equal(arrays[1], np.ones(8, np.float32))
    bad = [
        ((wire.Entry("k", 0, 4, "<f4"),), [np.ones(4, np.float32)], ["opt/mom"], []),  # wrong size
        ((e,), [np.ones(8, np.float32)], ["opt/m"], []),  # no such optimizer slot
        ((e,), [np.ones(8, np.float32)], ["pull/residual"], []),  # compression is off
        ((), [], [], [("k", 0, "opt/mom", 1)]),  # an array slot given as a number
        ((wire.Entry("x", 0, 8, "<f4"),), [np.ones(8, np.float32)], ["value"], []),  # unknown key
    ]
    for args in bad:
        with pytest.raises(store_mod.StoreError):
            st.set_state(*args)
    push = wire.Header(op=wire.PUSH, entries=(e,), body={"rank": 0})
    st.handle(store_mod.Request(b"", push, 0, [np.ones(8, np.float32)], [None]))
    with pytest.raises(store_mod.StoreError, match="round is open"):
        st.get_state()
    with pytest.raises(store_mod.StoreError, match="round is open"):
        st.set_state((e,), [np.ones(8, np.float32)], ["value"], [])


def test_state_messages_are_validated() -> None:
    e = wire.Entry("k", 0, 2, "<f4")
    h = wire.decode(wire.encode(wire.Header(op=wire.SET_STATE, entries=(e,), body={"slots": ["opt/mom"]})))
    assert wire.state_body(h) == (["opt/mom"], [])
    for body in (
        {"slots": []},
        {"slots": ["../etc"]},
        {"slots": ["value"], "scalars": [["k", 0, "opt/t", True]]},
        {"slots": ["value"], "scalars": [["k", 0, "value", 1]]},
        {"slots": ["value"], "scalars": "x"},
    ):
        with pytest.raises(WireError):
            wire.state_body(wire.Header(op=wire.SET_STATE, entries=(e,), body=body))
    with pytest.raises(KVError):
        kvstore.create("local").load_server_state({"nokey": {"value": np.ones(2)}})


LEARNER = """
from trainer_core.train import checkpoint
from trainer_core.train.learners import async_sgd_distributed_learner, data_parallel_distributed_learner
from trainer_core.optim.local import get_learner
cfg = json.loads(os.environ['TEST_CFG'])
path, mode, K, N = cfg['path'], cfg['mode'], cfg['k'], cfg['n']
params = {'W': np.linspace(-1, 1, 1200, dtype=np.float32).reshape(40, 30), 'b': np.zeros(30, np.float32)}
ck = checkpoint.load(path) if mode == 'resume' else None
if ck is not None:
    checkpoint.restore_params(params, ck)
if cfg['learner'] == 'async':
    dl = async_sgd_distributed_learner(get_learner('adam', params, lr=0.01), kv=kv)
else:
    dl = data_parallel_distributed_learner(get_learner('momentum', params, lr=0.05, momentum=0.9), 0, 1, kv=kv)
start = 0
if ck is not None:
    checkpoint.restore_learner(dl, ck)
    checkpoint.restore_server(kv, ck)
    kv.load_compression_state(ck.residuals if kv.rank == 0 else checkpoint.load_worker(path, kv.rank, ck.step))
    start = ck.step
for step in range(start, N):
    rng = np.random.default_rng([kv.rank, step])
    dl.update({k: 0.1 * v + rng.standard_normal(v.shape).astype(np.float32) for k, v in params.items()}, 8)
    if mode == 'first' and step + 1 == K:
        server = kv.server_state()
        if kv.rank == 0:
            checkpoint.save(path, params=params, learner=dl, residuals=kv.compression_state(),
                            server_state=server, step=K)
        else:
            checkpoint.save_worker(path, kv.rank, kv.compression_state(), step=K)
        kv.barrier()
emit(final={k: v.ravel().tolist() for k, v in params.items()})
"""


@pytest.mark.parametrize("learner", ["async", "data_parallel"])
def test_learner_resume_through_the_documented_flow(learner: str, tmp_path: Path) -> None:
    """docs/learners.md's sequence: restore params, build the learner, restore it, then the servers'
    state and the residuals (server Adam for the async learner on dist_sync; 1-bit data parallel)."""
    path = str(tmp_path / "ck.npz")

    def job(mode: str) -> Job:
        cfg = {"path": path, "mode": mode, "k": K, "n": N, "learner": learner}
        env = {"MXNET_KVSTORE_BIGARRAY_BOUND": "1000", "TEST_CFG": json.dumps(cfg)}
        return run_job(worker_script(LEARNER), 2, 2, env)

    through = finals(job("first"))
    resumed = finals(job("resume"))
    for got in (*through[1:], *resumed):
        for k in through[0]:
            assert got[k] == through[0][k]
