"""Kernel speed of the gradient compressors, side by side with MXNet 1.9.1's 2-bit quantizer.

    .venv/bin/python bench/compression.py              # 1e7 float32, MXNet included
    .venv/bin/python bench/compression.py --no-mxnet   # ours only
    .venv/bin/python bench/compression.py --n 1000000 --repeat 11 --json out.json
    .venv/bin/python bench/compression.py --no-mxnet --clock cpu --tree /tmp/old   # another tree's kernels

What is timed (all on one array of ``--n`` float32 values, input bytes = 4 n):

* ours: ``Compressor.encode(g)`` on a compressor whose residual already exists (steady state:
  residual add, quantize, pack, residual update, payload allocation), and
  ``Compressor.decode(payload, meta, shape, dtype, out=buf)`` into a preallocated array (as
  MXNet's dequantize writes into an existing NDArray); ``decode`` with a fresh output array is
  reported too. Each is run ``--repeat`` times after one warm-up call.
* MXNet: a ``device`` kvstore with ``set_gradient_compression({'type': '2bit', 'threshold':
  0.5})``, one ``mx.cpu()`` context pushing the array; MXNet's profiler (aggregate stats) reports
  the engine operators ``QuantizeCPU`` (MXNet's ``Quantize2BitImpl``: residual add, quantize,
  pack) and ``DequantizeCPU`` (``Dequantize2BitImpl``), i.e. the kernels alone, without the
  kvstore's copies and sums. Run under ``MXNET_ENGINE_TYPE=NaiveEngine`` so operators run one at a
  time, once with MXNet's default OpenMP threads and once with ``OMP_NUM_THREADS=1`` (ours are
  single-threaded).
* memcpy: ``numpy.copyto`` of the same array into a preallocated one (the ceiling for an
  encoder, which must read all 4 n bytes; a decoder into a preallocated array only writes them).

Ours are timed round-robin: every case once per round, ``--repeat`` rounds after a warm-up.

It also checks that MXNet and we agree: three pushes of random gradients through MXNet's
kvstore give exactly the values our 2bit ``decode(encode(g))`` gives, step by step.

The MXNet side runs in its own virtual environment of ``bench/peers.py``
(created on first use: ``pip install mxnet==1.9.1 'numpy<1.24'``; gitignored). Numbers on a
shared 2-core machine are noisy: compare the ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.peers import mxnet_python  # noqa: E402

MX_SCRIPT = r"""
import json, sys
import numpy as np
import mxnet as mx
n, repeat, seed = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(seed)
out = {"mxnet": mx.__version__}
# agreement: three pushes, pull the dequantized value after each
kv = mx.kv.create("device")
kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
m = 1000
kv.init(1, mx.nd.zeros(m))
pulled, grads = [], []
for step in range(3):
    g = (rng.standard_normal(m) * 0.4).astype(np.float32)
    grads.append(g.tolist())
    kv.push(1, mx.nd.array(g))
    o = mx.nd.zeros(m)
    kv.pull(1, out=o)
    pulled.append(o.asnumpy().tolist())
out["agree_grads"], out["agree_pulled"] = grads, pulled
# kernel times from the profiler
kv.init(0, mx.nd.zeros(n))
g = mx.nd.array(rng.standard_normal(n).astype(np.float32))
for _ in range(2):
    kv.push(0, g)
mx.nd.waitall()
import os, tempfile
prof_dir = tempfile.mkdtemp()  # never /dev/null: the profiler replaces its output file
mx.profiler.set_config(profile_all=True, aggregate_stats=True, filename=os.path.join(prof_dir, "profile.json"))
mx.profiler.set_state("run")
for _ in range(repeat):
    kv.push(0, g)
    mx.nd.waitall()
mx.profiler.set_state("stop")
for line in mx.profiler.dumps().splitlines():
    parts = line.split()
    if parts and parts[0] in ("QuantizeCPU", "DequantizeCPU"):
        count, total, tmin, tmax, tavg = parts[1:6]
        out[parts[0]] = {"count": int(count), "min_s": float(tmin) / 1e3, "mean_s": float(tavg) / 1e3}
print("RESULT " + json.dumps(out))
"""


def run_mxnet(n: int, repeat: int, seed: int, omp_threads: int | None) -> dict[str, Any]:
    env = dict(os.environ, MXNET_ENGINE_TYPE="NaiveEngine")
    if omp_threads:
        env["OMP_NUM_THREADS"] = str(omp_threads)
    proc = subprocess.run(
        [mxnet_python(), "-c", MX_SCRIPT, str(n), str(repeat), str(seed)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def summarize(times: list[float]) -> dict[str, float]:
    return {"min_s": min(times), "mean_s": statistics.fmean(times), "median_s": statistics.median(times)}


def bench_ours(n: int, repeat: int, seed: int, clock: Any = time.perf_counter) -> dict[str, Any]:
    """Every case once per round, ``repeat`` rounds (round-robin, so that a burst of load on the
    shared machine hits all cases alike), after one warm-up round."""
    from trainer_core.compression import _fast, get_compressor

    g = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    dst = np.empty_like(g)
    cases: dict[tuple[str, str], Any] = {("memcpy", "copy"): lambda: np.copyto(dst, g)}
    sizes: dict[str, int] = {"memcpy": 4 * n}
    kernels = ["numba", "numpy"] if _fast.available() else ["numpy"]
    for params in ({"type": "2bit", "threshold": 0.5}, {"type": "1bit"}, {"type": "topk", "ratio": 0.01}):
        for kernel in kernels:
            name = f"{params['type']} {kernel}"
            c = get_compressor({**params, "kernel": kernel})
            payload, meta = c.encode(g)
            out = np.empty_like(g)
            sizes[name] = int(payload.nbytes)
            cases[(name, "encode")] = lambda c=c: c.encode(g)
            cases[(name, "decode")] = lambda c=c, p=payload, m=meta, o=out: c.decode(
                p, m, g.shape, g.dtype, out=o
            )
            cases[(name, "decode_alloc")] = lambda c=c, p=payload, m=meta: c.decode(p, m, g.shape, g.dtype)
    if n % 2500 == 0:  # powersgd needs a matrix: 2500 x (n / 2500), e.g. 2500 x 4000 for 1e7
        name = "powersgd rank 4"
        c = get_compressor({"type": "powersgd", "rank": 4})
        gm = g.reshape(2500, -1)
        payload, meta = c.encode(gm)
        out = np.empty_like(gm)
        sizes[name] = int(payload.nbytes)
        cases[(name, "encode")] = lambda c=c: c.encode(gm)
        cases[(name, "decode")] = lambda c=c, p=payload, m=meta, o=out: c.decode(
            p, m, gm.shape, g.dtype, out=o
        )
        cases[(name, "decode_alloc")] = lambda c=c, p=payload, m=meta: c.decode(p, m, gm.shape, g.dtype)
    times: dict[tuple[str, str], list[float]] = {key: [] for key in cases}
    for rnd in range(repeat + 1):
        for key, fn in cases.items():
            t0 = clock()
            fn()
            if rnd:
                times[key].append(clock() - t0)
    results: dict[str, Any] = {}
    for (name, what), ts in times.items():
        results.setdefault(name, {"wire_bytes": sizes[name]})[what] = summarize(ts)
    return results


def check_agreement(mx: dict[str, Any]) -> bool:
    """Our 2bit decode(encode(g)) equals MXNet's pulled value at every step, exactly."""
    from trainer_core.compression import get_compressor

    c = get_compressor({"type": "2bit", "threshold": 0.5})
    for g, want in zip(mx["agree_grads"], mx["agree_pulled"], strict=True):
        arr = np.asarray(g, dtype=np.float32)
        payload, meta = c.encode(arr)
        if c.decode(payload, meta, arr.shape, np.float32).tolist() != [float(np.float32(x)) for x in want]:
            return False
    return True


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def table(n: int, ours: dict[str, Any], mx: dict[str, dict[str, Any]], stat: str) -> str:
    nbytes = 4 * n
    # ratios are against the faster of MXNet's runs
    ref = max((gbps(nbytes, r["QuantizeCPU"][stat]) for r in mx.values()), default=0.0)
    dref = max((gbps(nbytes, r["DequantizeCPU"][stat]) for r in mx.values()), default=0.0)
    rows = [
        "| kernel | encode GB/s | decode GB/s | decode (fresh output) GB/s "
        "| encode / MXNet quantize | decode / MXNet dequantize | payload bytes |",
        "|---|---|---|---|---|---|---|",
    ]
    mcp = gbps(nbytes, ours["memcpy"]["copy"][stat])
    rows.append(f"| memcpy (numpy.copyto of the same array) | {mcp:.2f} | {mcp:.2f} | | | | {nbytes} |")
    for label, r in mx.items():
        q, d = gbps(nbytes, r["QuantizeCPU"][stat]), gbps(nbytes, r["DequantizeCPU"][stat])
        rows.append(
            f"| MXNet 1.9.1 2bit, {label} | {q:.2f} | {d:.2f} | | {q / ref:.2f}x | {d / dref:.2f}x | {4 * -(-n // 16)} |"
        )
    for name, r in ours.items():
        if name == "memcpy":
            continue
        e, d, da = (gbps(nbytes, r[k][stat]) for k in ("encode", "decode", "decode_alloc"))
        if ref and dref:
            ratio_e, ratio_d = f"{e / ref:.1f}x", f"{d / dref:.1f}x"
        else:
            ratio_e = ratio_d = "n/a"
        rows.append(
            f"| ours {name} | {e:.2f} | {d:.2f} | {da:.2f} | {ratio_e} | {ratio_d} | {r['wire_bytes']} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=float, default=1e7, help="values per array (default 1e7)")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-mxnet", action="store_true", help="skip the MXNet side")
    ap.add_argument("--json", type=Path, help="also write the raw timings here")
    ap.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="time ours by the wall clock (default) or by this process's CPU time, which other "
        "processes on a busy machine do not inflate (their share of memory bandwidth still shows)",
    )
    ap.add_argument("--tree", type=Path, help="time the trainer_core of this tree (default: this one)")
    args = ap.parse_args(argv)
    if args.tree:
        if not (args.tree / "trainer_core" / "compression").is_dir():
            print(
                f"error: --tree {args.tree} holds no trainer_core/compression (want a launchkit tree)",
                file=sys.stderr,
            )
            return 2
        sys.path.insert(0, str(args.tree.resolve()))
    from trainer_core.compression import _fast

    if args.tree and not Path(_fast.__file__).resolve().is_relative_to(args.tree.resolve()):
        print(f"error: trainer_core was imported from {_fast.__file__}, not --tree", file=sys.stderr)
        return 2
    n = int(args.n)
    mx: dict[str, dict[str, Any]] = {}
    agree = None
    if not args.no_mxnet:
        mx["default threads"] = run_mxnet(n, args.repeat, args.seed, None)
        mx["OMP_NUM_THREADS=1"] = run_mxnet(n, args.repeat, args.seed, 1)
        agree = check_agreement(mx["default threads"])
    ours = bench_ours(
        n, args.repeat, args.seed, time.process_time if args.clock == "cpu" else time.perf_counter
    )
    print(
        f"# compression kernels, n = {n:.0e} float32 ({4 * n / 1e6:.0f} MB), best of {args.repeat} (GB/s of float32 input)"
    )
    print(
        f"# numba: {'yes' if _fast.available() else 'no'}; cores: {os.cpu_count()}; ours timed by {args.clock} clock"
    )
    if agree is not None:
        print(f"# MXNet agreement (3 pushes, decoded values identical): {'yes' if agree else 'NO'}")
    print()
    print(table(n, ours, mx, "min_s"))
    print()
    print(f"# mean of {args.repeat}")
    print(table(n, ours, mx, "mean_s"))
    if args.json:
        args.json.write_text(
            json.dumps({"n": n, "clock": args.clock, "ours": ours, "mxnet": mx, "agree": agree}, indent=1)
        )
    return 0 if agree in (None, True) else 1


if __name__ == "__main__":
    sys.exit(main())
