"""The worker program of test_collective_hosts.py (a ``-s 0`` job over ssh on namespace hosts),
and the deterministic inputs that the test rebuilds to compute its references.

collhostsprog.py check [BIG]   every dtype and op of allreduce at sizes 0, 1, 7, 100_003 (and a
                               float32 array of BIG elements), a broadcast, a ragged allgather
                               and a reduce_scatter through ``trainer_core.collective``; prints
                               one JSON line: the sha256 of every result, the algorithm each
                               allreduce took, rank/size/local rank and size, and whether every
                               rank's digests (allgathered) were the same
collhostsprog.py kill RANK     allreduces of 1e6 float32 in a loop; worker RANK SIGKILLs itself
                               after its third (the others are in the fourth); the others print
                               the error their allreduce raised, with the time
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import threading
import time

import numpy as np

SIZES = (0, 1, 7, 100_003)
INT_KINDS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
FLOAT_KINDS = ("float16", "float32", "float64", "bfloat16")
OPS = {
    **{k: ("sum", "max", "min") for k in INT_KINDS},
    **{k: ("sum", "mean", "max", "min") for k in FLOAT_KINDS},
}


def inputs(rank: int, n: int, kind: str) -> np.ndarray:
    """Rank ``rank``'s array of ``n`` elements of ``kind``. Integers span their whole range (sums
    wrap, exactly); floats are small multiples of a power of two, so that a sum over up to 8 ranks
    is exact in the dtype whatever the order (the reference need not know the algorithm's)."""
    rng = np.random.default_rng(7919 * rank + n + 31 * len(kind))
    if kind in INT_KINDS:
        info = np.iinfo(kind)
        return rng.integers(info.min, info.max, n, dtype=kind, endpoint=True)
    if kind == "float16":  # multiples of 1/4 up to 200: sums up to 1600 quarters < 2**11
        return (rng.integers(-200, 200, n) / 4).astype(np.float16)
    if kind == "bfloat16":  # integers up to 31: sums below 2**8, exact in bfloat16
        return (rng.integers(-31, 32, n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return (rng.integers(-8000, 8000, n) / 8).astype(kind)


def bf16_round(f32: np.ndarray) -> np.ndarray:
    """float32 values as bfloat16 bits, to nearest, ties to even (the reference's own rounding)."""
    u = np.ascontiguousarray(f32, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def reference(kind: str, op: str, arrays: list[np.ndarray]) -> np.ndarray:
    """What every rank must get, computed without trainer_core (exact sums: see ``inputs``)."""
    if kind == "bfloat16":
        vals = [(a.astype(np.uint32) << 16).view(np.float32) for a in arrays]
        if op in ("max", "min"):
            return bf16_round(getattr(np, f"{op}imum").reduce(vals)) if vals[0].size else arrays[0].copy()
        total = np.sum(vals, axis=0, dtype=np.float64).astype(np.float32)
        return bf16_round(total / np.float32(len(arrays)) if op == "mean" else total)
    if op in ("max", "min"):
        return getattr(np, f"{op}imum").reduce(arrays) if arrays[0].size else arrays[0].copy()
    dt = arrays[0].dtype
    if kind in INT_KINDS:
        total = arrays[0].copy()
        for a in arrays[1:]:
            np.add(total, a, out=total)  # wraps, as the collective's sums do
        return total
    total = np.sum(arrays, axis=0, dtype=np.float64).astype(dt)  # exact: see inputs()
    if op != "mean":
        return total
    if kind == "float16":
        return (total.astype(np.float32) / np.float32(len(arrays))).astype(np.float16)
    return total / dt.type(len(arrays))


def digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]


def check(big: int) -> None:
    from trainer_core import collective

    g = collective.group()
    r, n = g.rank, g.size
    out: dict = {"rank": r, "size": n, "local": [g.local_rank, g.local_size], "hosts": list(g.hosts)}
    algos = set()
    for kind in INT_KINDS + FLOAT_KINDS:
        for op in OPS[kind]:
            for size in SIZES:
                x = inputs(r, size, kind)
                if kind == "bfloat16":
                    res = g.allreduce(x, op, kind="bfloat16")
                else:
                    res = collective.allreduce(x, op)
                algos.add(g.last_algorithm)
                out[f"{kind}/{op}/{size}"] = digest(res)
    if big:
        t0 = time.perf_counter()
        res = collective.allreduce(inputs(r, big, "float32"))
        out["big_s"] = time.perf_counter() - t0
        out[f"float32/sum/{big}"] = digest(res)
        algos.add(g.last_algorithm)
    out["algorithms"] = sorted(algos)
    # arbitrary float32 values: the order of the additions shows in the bits, yet every rank agrees
    noise = np.random.default_rng(r).standard_normal(100_003).astype(np.float32)
    res = collective.allreduce(noise)
    out["noise"] = digest(res)
    out["noise_head"] = res[:4].tolist()
    out["bcast"] = digest(
        collective.broadcast(inputs(r, 1001, "float64") if r == 4 else np.zeros(1001), root=4)
    )
    out["gather"] = digest(collective.allgather(np.full((r + 1, 3), r, dtype=np.int32)))
    out["scatter"] = digest(collective.reduce_scatter(inputs(r, 6 * 5 + 1, "int64").reshape(31, 1)))
    # bit-identity checked in the job too: every rank's digests, allgathered
    keys = {k: v for k, v in out.items() if k not in ("rank", "local", "big_s", "scatter")}
    mine = np.frombuffer(hashlib.sha256(json.dumps(keys, sort_keys=True).encode()).digest(), np.uint8)
    every = collective.allgather(mine.reshape(1, -1))
    out["all_same"] = bool((every == every[0]).all())
    collective.shutdown()
    print(json.dumps(out), flush=True)


def kill(victim: int) -> None:
    from trainer_core import collective

    g = collective.group()
    x = np.ones(1_000_000, np.float32)
    for i in range(1000):
        if i == 3 and g.rank == victim:
            print(
                json.dumps({"rank": g.rank, "killed_at": time.time(), "host": os.uname().nodename}),
                flush=True,
            )
            threading.Timer(0.01, os.kill, (os.getpid(), signal.SIGKILL)).start()
        try:
            collective.allreduce(x)
        except Exception as exc:  # the job failed: say how, and when
            print(json.dumps({"rank": g.rank, "error": str(exc), "at": time.time(), "i": i}), flush=True)
            collective.default.set(None)
            raise SystemExit(1) from None
    print(json.dumps({"rank": g.rank, "error": None}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "check":
        check(int(float(sys.argv[2])) if len(sys.argv) > 2 else 0)
    else:
        kill(int(sys.argv[2]))
