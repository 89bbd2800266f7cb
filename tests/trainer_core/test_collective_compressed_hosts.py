"""The compressed allreduce with several ranks per host (trainer_core.collective.group's
hierarchical compressed path), in one process: hosts simulated by threads sharing a segment (or,
without one, a tree on the links). Each host sums in full precision, only the hosts' leaders run
the two-stage compressed allreduce on their host's sum with their own error feedback, and the
result goes back to the host: equal to a reference built from the compressors alone on the
hosts' sums, bit-identical on every rank, over three steps (the leaders' residuals carry over)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.trainer_core.test_collective_shm import locals_for, run_closing
from trainer_core import compression
from trainer_core.collective import ErrorFeedback, Group
from trainer_core.collective.algorithms.hierarchical import Topology
from trainer_core.collective.algorithms.ring import blocks
from trainer_core.collective.fabric import Fabric


def reference(
    params: dict[str, Any], hosts: list[str], steps: list[list[np.ndarray]], op: str
) -> list[np.ndarray]:
    """Each host's sum (its ranks in order), then the two-stage scheme over the hosts from the
    compressors alone (one per host and chunk, one per chunk's owner), ``mean`` dividing by every
    rank of the group before the second stage."""
    topo = Topology.of(hosts)
    leaders, w, n = topo.leaders(), len(hosts), steps[0][0].size
    bounds = blocks(n, len(leaders))
    workers = [[compression.get_compressor(params) for _ in leaders] for _ in leaders]
    servers = [compression.get_compressor(params) for _ in leaders]
    results = []
    for xs in steps:
        sums = []
        for leader in leaders:
            s = xs[leader].copy()
            for r in topo.local(leader)[1:]:
                s = s + xs[r]
            sums.append(s)
        out = np.empty(n, xs[0].dtype)
        for c, (a, b) in enumerate(bounds):
            total = None
            for h in range(len(leaders)):
                payload, meta = workers[h][c].encode(sums[h][a:b])
                dec = compression.decode(payload, meta, (b - a,), xs[0].dtype)
                total = dec.copy() if total is None else total + dec
            assert total is not None
            if op == "mean":
                total = total / xs[0].dtype.type(w)
            payload, meta = servers[c].encode(total.astype(xs[0].dtype))
            out[a:b] = compression.decode(payload, meta, (b - a,), xs[0].dtype)
        results.append(out)
    return results


def run(
    params: dict[str, Any],
    hosts: list[str],
    steps: list[list[np.ndarray]],
    op: str,
    shm: bool,
    into: str = "fresh",
) -> list[list[np.ndarray]]:
    """Every rank's results; ``into``: ``fresh`` results, an ``out`` array apart, or ``inplace``
    (``out`` = a copy of the input)."""
    w = len(hosts)
    fabric = Fabric(w, timeout=10, eager=False)
    locs = locals_for(hosts) if shm else [None] * w

    def one(g: Group, x: np.ndarray, state: ErrorFeedback) -> np.ndarray:
        if into == "fresh":
            return np.asarray(g.compressed_allreduce(x, state, key="w", op=op))
        y = x.copy() if into == "inplace" else np.full_like(x, np.nan)
        src = y if into == "inplace" else x
        assert g.compressed_allreduce(src, state, key="w", op=op, out=y) is y
        return y

    def body(r: int) -> list[np.ndarray]:
        state = ErrorFeedback(params)
        with Group(fabric.endpoint(r), hosts=hosts, local=locs[r]) as g:
            return [one(g, xs[r], state) for xs in steps]

    return run_closing(locs, body)


HOSTS = [["a", "a", "b", "b", "c", "c"], ["a", "a", "a", "b", "b", "c"]]


@pytest.mark.parametrize("shm", [True, False], ids=["shm", "tree"])
@pytest.mark.parametrize("hosts", HOSTS, ids=["3x2", "3-2-1"])
@pytest.mark.parametrize(
    "params", [{"type": "1bit", "block_size": 64}, {"type": "topk", "ratio": 0.05}], ids=lambda p: p["type"]
)
def test_hierarchical_matches_the_compressors_reference_on_the_hosts_sums(
    params: dict[str, Any], hosts: list[str], shm: bool
) -> None:
    w, n = len(hosts), 3001
    rng = np.random.default_rng(7)
    steps = [[rng.standard_normal(n).astype(np.float32) for _ in range(w)] for _ in range(3)]
    before = [[x.copy() for x in xs] for xs in steps]
    for op in ("mean", "sum"):
        out = run(params, hosts, steps, op, shm)
        assert all(
            np.array_equal(x, y)
            for xs, ys in zip(steps, before, strict=True)
            for x, y in zip(xs, ys, strict=True)
        )
        want = reference(params, hosts, steps, op)
        for s in range(3):
            for r in range(w):
                assert out[r][s].tobytes() == out[0][s].tobytes()  # bit-identical on every rank
            np.testing.assert_allclose(out[0][s], want[s], rtol=1e-5, atol=1e-5)


def test_hierarchical_keeps_one_residual_per_host_on_its_leader() -> None:
    """The leader's state holds the hosts' compressors (one per host's chunk); another rank's
    state is never touched (the residual of the host's sum is the leader's)."""
    hosts = ["a", "a", "b", "b"]
    fabric = Fabric(4, timeout=10, eager=False)
    locs = locals_for(hosts)
    x = np.linspace(-1, 1, 512).astype(np.float32)

    def body(r: int) -> tuple[int, bool]:
        state = ErrorFeedback({"type": "1bit", "block_size": 64})
        with Group(fabric.endpoint(r), hosts=hosts, local=locs[r]) as g:
            g.compressed_allreduce(x, state, key="k")
        st = state.keys["k"]
        residuals = [c.residual for c in [*st.workers, st.server] if getattr(c, "residual", None) is not None]
        return len(st.workers), bool(residuals) and any(np.any(res) for res in residuals)

    got = run_closing(locs, body)
    assert [n for n, _ in got] == [2, 2, 2, 2]
    assert [used for _, used in got] == [True, False, True, False]


@pytest.mark.parametrize("into", ["out", "inplace"])
@pytest.mark.parametrize("hosts", HOSTS, ids=["3x2", "3-2-1"])
def test_out_and_the_hosts_split_sum_match_the_reference(hosts: list[str], into: str) -> None:
    """Large enough that a host of three ranks splits its sum by blocks (``shm_split``), the result
    written into ``out`` (apart, or the input itself): the reference's, bit-identical everywhere."""
    params = {"type": "1bit", "block_size": 64}
    w, n = len(hosts), 300_001
    rng = np.random.default_rng(11)
    steps = [[rng.standard_normal(n).astype(np.float32) for _ in range(w)] for _ in range(2)]
    before = [[x.copy() for x in xs] for xs in steps]
    out = run(params, hosts, steps, "sum", True, into)
    assert all(
        np.array_equal(x, y)
        for xs, ys in zip(steps, before, strict=True)
        for x, y in zip(xs, ys, strict=True)
    )
    want = reference(params, hosts, steps, "sum")
    for s in range(2):
        for r in range(w):
            assert out[r][s].tobytes() == out[0][s].tobytes()
        np.testing.assert_allclose(out[0][s], want[s], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("into", ["fresh", "out", "inplace"])
def test_a_leader_of_two_encodes_its_hosts_sum_without_forming_it_with_the_same_bits(
    into: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With two ranks on a host, a leader whose compressor ``encodes_sum`` hands its input and the
    other rank's slot to the encoder instead of writing their sum first: every rank's result, over
    three steps (the residuals carry over), is what the path that forms the sum gives, bit for bit."""
    from trainer_core.compression import _fast, _fast_onebit
    from trainer_core.compression.onebit import OneBit

    params = {"type": "1bit", "block_size": 64}
    hosts = HOSTS[0]
    w, n = len(hosts), 64 * 4 * 3 * 3 + 64 * 2 + 17  # each leader's chunk: quads, blocks, a short one
    rng = np.random.default_rng(13)
    steps = [[rng.standard_normal(n).astype(np.float32) for _ in range(w)] for _ in range(3)]
    calls = {"sum": 0}
    if _fast.available():
        kernel = _fast_onebit.onebit_encode_sum

        def counted(*a: Any) -> Any:
            calls["sum"] += 1
            return kernel(*a)

        monkeypatch.setattr(_fast_onebit, "onebit_encode_sum", counted)
    fused = run(params, hosts, steps, "mean", True, into)
    assert calls["sum"] == (3 * 3 * 3 if _fast.available() else 0)  # 3 leaders x 3 chunks x 3 steps
    monkeypatch.setattr(OneBit, "encodes_sum", lambda self, grad: False)
    formed = run(params, hosts, steps, "mean", True, into)
    for r in range(w):
        assert [y.tobytes() for y in fused[r]] == [y.tobytes() for y in formed[r]]
