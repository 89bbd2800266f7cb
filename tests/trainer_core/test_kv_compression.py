"""Gradient compression inside the KV store: pushes and pulls compressed, residuals on both sides.

The distributed cases run real jobs (``cluster.run_job``) and compare every pulled value with a
reference computed here from the compressors alone: each worker encodes its push with its own
residual per key part, the server decodes and sums, then encodes the sum once with its own
residual and every worker decodes that same payload.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.trainer_core.cluster import KERNELS_LOADING, Job, run_job, worker_script
from trainer_core import kv as kvstore
from trainer_core.compression import get_compressor
from trainer_core.compression.codec import ServerCodec, WorkerCodec, check_meta, resolve_compression
from trainer_core.errors import CompressionError, WireError
from trainer_core.ps import protocol as wire
from trainer_core.ps import store as store_mod

STEPS = 3


def grad(rank: int, step: int, n: int) -> np.ndarray:
    return np.random.default_rng([rank, step, n]).standard_normal(n).astype(np.float32)


def reference(params: dict, workers: int, bounds: list[tuple[int, int]], n: int) -> list[np.ndarray]:
    """What every worker pulls at each step, part by part."""
    wcomp = [[get_compressor(params) for _ in bounds] for _ in range(workers)]
    scomp = [get_compressor(params) for _ in bounds]
    outs = []
    for step in range(STEPS):
        out = np.empty(n, np.float32)
        for i, (a, b) in enumerate(bounds):
            total = None
            for r in range(workers):
                payload, meta = wcomp[r][i].encode(grad(r, step, n)[a:b])
                part = wcomp[r][i].decode(payload, meta, (b - a,), np.float32)
                total = part.copy() if total is None else total + part
            payload, meta = scomp[i].encode(total)
            out[a:b] = scomp[i].decode(payload, meta, (b - a,), np.float32)
        outs.append(out)
    return outs


BODY = """
params = json.loads(os.environ['TEST_COMP'])
n = 3000
kv.init(['g', 'count'], [np.zeros(n, np.float32), np.zeros(4, np.int32)])
kv.set_gradient_compression(params)
before = kv.wire_stats()
bounds = [(p.start, p.stop) for p in kv.meta['g'].parts]
for step in range(3):
    g = np.random.default_rng([kv.rank, step, n]).standard_normal(n).astype(np.float32)
    out, cnt = np.empty(n, np.float32), np.empty(4, np.int32)
    kv.pushpull(['g', 'count'], [g, np.full(4, kv.rank + 1, np.int32)], [out, cnt])
    emit(step=step, out=out.tolist(), count=cnt.tolist(), bounds=bounds)
pulled = np.empty(n, np.float32)
kv.pull('g', pulled)
after = kv.wire_stats()
emit(pulled=pulled.tolist(), stats={k: after[k] - before[k] for k in after}, state=sorted(kv.compression_state()))
"""


def assert_clean(job: Job) -> None:
    assert all(code == 0 for code in job.codes().values()), job.outputs()
    assert job.leftover_shm == [], job.leftover_shm


@pytest.mark.parametrize(
    ("params", "shm", "servers"),
    [
        ({"type": "1bit"}, "1", 1),
        # (3 to 3.5 s of CPU each, mostly every process loading the compiled kernels: the full run)
        pytest.param({"type": "1bit", "block_size": 512}, "0", 2, marks=pytest.mark.slow),
        pytest.param({"type": "2bit", "threshold": 0.5}, "1", 2, marks=pytest.mark.slow),
    ],
)
def test_compressed_pushpull_matches_the_reference(params: dict, shm: str, servers: int) -> None:
    import json

    env = {
        "TEST_COMP": json.dumps(params),
        "PS_SHM": shm,
        "MXNET_KVSTORE_BIGARRAY_BOUND": "1000",
        **KERNELS_LOADING,
    }
    job = run_job(worker_script(BODY), 2, servers, env)
    assert_clean(job)
    n = 3000
    for w in job.workers:
        res = w.results()
        bounds = [tuple(b) for b in res[0]["bounds"]]
        assert len(bounds) == servers
        want = reference(params, 2, bounds, n)
        for step in range(STEPS):
            np.testing.assert_array_equal(np.array(res[step]["out"], np.float32), want[step])
            assert res[step]["count"] == [3, 3, 3, 3]  # int keys travel raw
        last = res[STEPS]
        # a pull of an unchanged value resends the same payload (no new residual step)
        np.testing.assert_array_equal(np.array(last["pulled"], np.float32), want[-1])
        stats = last["stats"]
        raw = 4 * n * STEPS
        assert stats["raw_sent"] == raw + 16 * STEPS
        ratio = 25 if params["type"] == "1bit" else 15
        assert stats["sent"] < (raw / ratio) + 16 * STEPS
        assert stats["received"] < (raw + 4 * n) / ratio + 16 * STEPS
        assert last["state"] == [f"g/{i}" for i in range(servers)]


def test_local_store_compresses_pushes_and_pulls_like_one_dist_worker() -> None:
    kv = kvstore.create("local")
    n = 1000
    kv.init("g", np.zeros(n, np.float32))
    kv.set_gradient_compression({"type": "1bit", "block_size": 256})
    want = reference({"type": "1bit", "block_size": 256}, 1, [(0, n)], n)
    for step in range(STEPS):
        out = np.empty(n, np.float32)
        kv.pushpull("g", grad(0, step, n), out)
        np.testing.assert_array_equal(out, want[step])
    stats = kv.wire_stats()
    assert stats["raw_sent"] == 4 * n * STEPS and stats["sent"] < stats["raw_sent"] / 25
    assert sorted(kv.compression_state()) == ["g/0"]
    kv.set_gradient_compression({"type": "none"})
    out = np.empty(n, np.float32)
    kv.pushpull("g", np.ones(n, np.float32), out)
    np.testing.assert_array_equal(out, np.ones(n, np.float32))


def test_resolve_and_refuse() -> None:
    assert resolve_compression({"type": "none"}) is None
    assert resolve_compression({"type": "2bit", "threshold": 0.1}) == {"type": "2bit", "threshold": 0.1}
    with pytest.raises(CompressionError, match="unknown compression type 'zip'; known: ") as zip_type:
        resolve_compression({"type": "zip"})
    assert "unsupported" not in str(zip_type.value)
    # the type is supported, its parameter is not: the message says so, not "unsupported type"
    with pytest.raises(CompressionError) as bad_threshold:
        resolve_compression({"type": "2bit", "threshold": -1})
    message = str(bad_threshold.value)
    assert "parameter 'threshold' must be a positive finite number, got -1" in message
    assert "unsupported" not in message


def test_entry_metadata_on_the_wire() -> None:
    e = wire.Entry("w", 1, 100, "<f4", comp={"type": "1bit", "block_size": 2048})
    h = wire.decode(wire.encode(wire.Header(op=wire.PUSH, seq=3, entries=(e,))))
    assert h.entries == (e,)

    def received(meta: object) -> dict:
        raw = {"v": 1, "op": "push", "e": [{"k": "w", "p": 0, "n": 4, "dt": "<f4", "c": meta}]}
        return check_meta(wire.decode(__import__("json").dumps(raw).encode()).entries[0].comp)

    for bad in ({"type": "1bit", "x": [1]}, "1bit"):  # not an object of plain scalars: the wire refuses
        with pytest.raises(WireError, match="metadata"):
            received(bad)
    for bad in ({"block_size": 8}, {"type": 1}):  # no compressor named: refused before any decoding
        with pytest.raises((WireError, CompressionError), match="metadata"):
            received(bad)
    raw = {
        "v": 1,
        "op": "push",
        "e": [{"k": "w", "p": 0, "n": 4, "dt": "<f4", "c": {"type": "1bit"}, "shm": "launchkit-j-1"}],
    }
    with pytest.raises(WireError, match="frame"):
        wire.decode(__import__("json").dumps(raw).encode())


def test_server_codec_encodes_each_version_once() -> None:
    codec = ServerCodec()
    codec.set_params({"type": "1bit"})
    v = np.linspace(-1, 1, 64, dtype=np.float32)
    p1, _ = codec.encode(("k", 0), 7, v)
    p2, _ = codec.encode(("k", 0), 7, v)
    assert p1 is p2  # every worker pulling version 7 gets the same bytes
    p3, _ = codec.encode(("k", 0), 8, v)
    assert p3 is not p1
    assert not codec.active(np.int32) and codec.active(np.float16)


def test_worker_codec_state_round_trip() -> None:
    codec = WorkerCodec()
    codec.set_params({"type": "2bit", "threshold": 0.5})
    g = np.linspace(-1, 1, 32, dtype=np.float32)
    codec.encode("w", 0, g)
    state = codec.state()
    other = WorkerCodec()
    other.set_params({"type": "2bit", "threshold": 0.5})
    other.load_state(state, {"w": "w"})
    a, _ = codec.encode("w", 0, g)
    b, _ = other.encode("w", 0, g)
    np.testing.assert_array_equal(a, b)


def test_store_answers_compressed_pulls_with_metadata() -> None:
    st = store_mod.Store(num_workers=1)
    init = wire.Header(op=wire.INIT, entries=(wire.Entry("k", 0, 8, "<f4"),), body={"rank": 0})
    st.handle(store_mod.Request(b"", init, 0, [np.arange(8, dtype=np.float32)], [None]))
    st.set_compression({"type": "1bit"})
    pull = wire.Header(op=wire.PULL, entries=(wire.Entry("k", 0, 8, "<f4"),), body={"rank": 0})
    (req,) = st.handle(store_mod.Request(b"", pull, 0, [None], [None]))
    assert req.metas[0] is not None and req.metas[0]["type"] == "1bit"
    assert req.results[0] is not None and req.results[0].dtype == np.uint8


def test_with_a_server_optimizer_pulls_carry_the_weights_whole() -> None:
    """The value a server with an optimizer holds is the weights: compressing them to 1 bit each
    (what the servers did) left a model that does not train; only pushed gradients are compressed."""
    st = store_mod.Store(num_workers=1)
    init = wire.Header(op=wire.INIT, entries=(wire.Entry("k", 0, 8, "<f4"),), body={"rank": 0})
    st.handle(store_mod.Request(b"", init, 0, [np.arange(8, dtype=np.float32)], [None]))
    st.set_compression({"type": "1bit"})
    st.set_optimizer({"type": "sgd", "learning_rate": 0.5})
    push = wire.Header(op=wire.PUSH, entries=(wire.Entry("k", 0, 8, "<f4"),), body={"rank": 0})
    st.handle(store_mod.Request(b"", push, 0, [np.ones(8, dtype=np.float32)], [None]))
    pull = wire.Header(op=wire.PULL, entries=(wire.Entry("k", 0, 8, "<f4"),), body={"rank": 0})
    (req,) = st.handle(store_mod.Request(b"", pull, 0, [None], [None]))
    assert req.metas[0] is None
    np.testing.assert_array_equal(req.results[0], np.arange(8, dtype=np.float32) - 0.5)
