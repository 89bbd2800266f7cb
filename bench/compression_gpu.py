"""GPU compression kernels: the CUDA kernels against the array-module kernels on cupy, and MXNet's GPU
2-bit quantizer where an MXNet CUDA build imports.

    python bench/compression_gpu.py                    # 1e7 float32 on the current GPU
    python bench/compression_gpu.py --n 1e6 --repeat 21 --json out.json
    python bench/compression_gpu.py --mxnet-python /opt/mx-cu112/bin/python   # MXNet beside

Needs cupy and a GPU; without them it says which is missing and exits with status 2.

What is timed (one array of ``--n`` float32 values on the GPU; GB/s of float32 input, 4 n bytes):

* ``cuda``: ``Compressor.encode(g)`` on a cupy array (the CUDA kernels of
  ``trainer_core/compression/_cuda.py``; steady state: the residual exists) and
  ``decode(payload, meta, ..., out=buf)`` into a preallocated cupy array;
* ``cupy chain``: the same calls with ``kernel='numpy'``, the array-module kernels (chains of cupy
  operations), which is what cupy arrays ran before the CUDA kernels;
* ``push``: what a worker does with a cupy gradient before sending it: ``WorkerCodec.encode`` (the
  CUDA encode, then the payload copied to pinned host memory), beside the path that copies the
  whole gradient to the host first (``cupy.asnumpy``) and encodes it there (numba);
* ``memcpy``: ``cupy.copyto`` of the same array on the device (the ceiling for an encoder).

Every case runs once per round, ``--repeat`` rounds after a warm-up round, each call followed by a
device synchronisation (the time includes launches and the few host synchronisations of top-k).
Before timing, each compressor's payload and residual on the GPU are compared byte for byte with
the host kernels' (three steps); the report says whether they were identical.

MXNet: ``--mxnet-python`` names an interpreter with an MXNet CUDA build (``pip install
mxnet-cu112==1.9.1`` or the wheel matching the machine's CUDA; default: this interpreter if it
imports mxnet). A ``device`` kvstore with ``2bit`` compression pushes the array from ``mx.gpu(0)``;
MXNet's profiler reports its quantize and dequantize operators (names starting with
``Quantize``/``Dequantize``: ``QuantizeGPU``). Where no such interpreter is there, the report says
"MXNet: not run" and why.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer_core.compression import get_compressor, kernels  # noqa: E402
from trainer_core.compression.codec import WorkerCodec  # noqa: E402

PARAMS = ({"type": "2bit", "threshold": 0.5}, {"type": "1bit"}, {"type": "topk", "ratio": 0.01})

MX_SCRIPT = r"""
import json, os, sys, tempfile
import numpy as np
import mxnet as mx
n, repeat, seed = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
if mx.context.num_gpus() < 1:
    print("RESULT " + json.dumps({"error": "this MXNet sees no GPU (a CPU build?)"}))
    sys.exit(0)
ctx = mx.gpu(0)
rng = np.random.default_rng(seed)
kv = mx.kv.create("device")
kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
kv.init(0, mx.nd.zeros(n, ctx=ctx))
g = mx.nd.array(rng.standard_normal(n).astype(np.float32), ctx=ctx)
for _ in range(2):
    kv.push(0, g)
mx.nd.waitall()
mx.profiler.set_config(profile_all=True, aggregate_stats=True,
                       filename=os.path.join(tempfile.mkdtemp(), "profile.json"))
mx.profiler.set_state("run")
for _ in range(repeat):
    kv.push(0, g)
    mx.nd.waitall()
mx.profiler.set_state("stop")
out = {"mxnet": mx.__version__, "ops": {}}
for line in mx.profiler.dumps().splitlines():
    parts = line.split()
    if parts and parts[0].startswith(("Quantize", "Dequantize")):
        count, total, tmin, tmax, tavg = parts[1:6]
        out["ops"][parts[0]] = {"count": int(count), "min_s": float(tmin) / 1e3, "mean_s": float(tavg) / 1e3}
print("RESULT " + json.dumps(out))
"""


def gpu_or_exit(prog: str = "compression_gpu") -> Any:
    """cupy, with a usable GPU; otherwise a message (from ``prog``) and exit status 2."""
    try:
        import cupy
    except ImportError as exc:
        print(
            f"{prog}: cupy cannot be imported ({exc}); install launchkit[gpu] on a GPU machine",
            file=sys.stderr,
        )
        sys.exit(2)
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA device")
        cupy.zeros(1).sum().item()
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        print(f"{prog}: no usable GPU ({type(exc).__name__}: {first}); nothing timed", file=sys.stderr)
        sys.exit(2)
    return cupy


def identical(cupy: Any, g: Any, params: dict[str, Any]) -> bool:
    """Payloads and residuals of three steps byte-identical to the host kernels'."""
    host, dev = get_compressor(params), get_compressor(params)
    for step in range(3):
        x = g * (1.0 + step) if step else g
        want, _ = host.encode(cupy.asnumpy(x))
        got, _ = dev.encode(x)
        if cupy.asnumpy(got).tobytes() != want.tobytes():
            return False
        if cupy.asnumpy(dev.residual).tobytes() != host.residual.tobytes():
            return False
    return True


def bench_gpu(cupy: Any, n: int, repeat: int, seed: int) -> tuple[dict[str, Any], dict[str, bool]]:
    g = cupy.asarray(np.random.default_rng(seed).standard_normal(n).astype(np.float32))
    dst = cupy.empty_like(g)
    sync = cupy.cuda.Device().synchronize
    cases: dict[tuple[str, str], Any] = {("memcpy", "copy"): lambda: cupy.copyto(dst, g)}
    same: dict[str, bool] = {}
    for params in PARAMS:
        name = params["type"]
        same[name] = identical(cupy, g, params)
        for label, kernel in (("cuda", "auto"), ("cupy chain", "numpy")):
            c = get_compressor({**params, "kernel": kernel})
            payload, meta = c.encode(g)
            out = cupy.empty_like(g)
            cases[(f"{name} {label}", "encode")] = lambda c=c: c.encode(g)
            cases[(f"{name} {label}", "decode")] = lambda c=c, p=payload, m=meta, o=out: c.decode(
                p, m, g.shape, g.dtype, out=o
            )
        codec = WorkerCodec()
        codec.params = dict(params)
        host_c = get_compressor(params)
        cases[(f"{name} push", "device encode + payload to host")] = lambda codec=codec: codec.encode(
            "k", 0, g
        )
        cases[(f"{name} push", "whole gradient to host + host encode")] = lambda h=host_c: h.encode(
            cupy.asnumpy(g)
        )
    times: dict[tuple[str, str], list[float]] = {key: [] for key in cases}
    for rnd in range(repeat + 1):
        for key, fn in cases.items():
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            if rnd:
                times[key].append(time.perf_counter() - t0)
    results: dict[str, Any] = {}
    for (name, what), ts in times.items():
        results.setdefault(name, {})[what] = {"min_s": min(ts), "mean_s": statistics.fmean(ts)}
    return results, same


def run_mxnet(python: str | None, n: int, repeat: int, seed: int) -> dict[str, Any]:
    """MXNet's GPU quantizer timings, or ``{"error": why it did not run}``."""
    py = python or sys.executable
    probe = subprocess.run([py, "-c", "import mxnet"], capture_output=True, text=True)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["import failed"])[-1]
        return {"error": f"{py} cannot import mxnet ({last}); give --mxnet-python with mxnet-cu*"}
    proc = subprocess.run(
        [py, "-c", MX_SCRIPT, str(n), str(repeat), str(seed)], capture_output=True, text=True
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return {"error": f"the MXNet run failed: {last}"}
    res: dict[str, Any] = json.loads(line[len("RESULT ") :])
    if not res.get("error") and not res.get("ops"):
        res["error"] = "MXNet's profiler reported no Quantize/Dequantize operator"
    return res


def table(n: int, ours: dict[str, Any], mx: dict[str, Any], stat: str) -> str:
    nbytes = 4 * n
    rows = ["| case | what | ms | GB/s of float32 input |", "|---|---|---|---|"]
    for name, whats in ours.items():
        for what, r in whats.items():
            rows.append(f"| {name} | {what} | {r[stat] * 1e3:.3f} | {nbytes / r[stat] / 1e9:.1f} |")
    for op, r in sorted(mx.get("ops", {}).items()):
        rows.append(
            f"| MXNet {mx['mxnet']} 2bit | {op} | {r[stat] * 1e3:.3f} | {nbytes / r[stat] / 1e9:.1f} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=float, default=1e7, help="values per array (default 1e7)")
    ap.add_argument("--repeat", type=int, default=11)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mxnet-python", help="an interpreter with an MXNet CUDA build (default: this one)")
    ap.add_argument("--no-mxnet", action="store_true", help="skip the MXNet side")
    ap.add_argument("--json", type=Path, help="also write the raw timings here")
    args = ap.parse_args(argv)
    n = int(args.n)
    if n < 1 or args.repeat < 1:
        print("compression_gpu: --n and --repeat must be at least 1", file=sys.stderr)
        return 2
    cupy = gpu_or_exit()
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    ours, same = bench_gpu(cupy, n, args.repeat, args.seed)
    mx = (
        {"error": "skipped (--no-mxnet)"}
        if args.no_mxnet
        else run_mxnet(args.mxnet_python, n, args.repeat, args.seed)
    )
    ran = sorted(name for name, k in kernels._cuda_built.items() if k is not None)
    print(f"# GPU compression kernels, n = {n:.0e} float32 ({4 * n / 1e6:.0f} MB), {props['name'].decode()}")
    print(
        f"# cupy {cupy.__version__}; CUDA kernels ran for: {', '.join(ran) or 'none (array-module fallback)'}"
    )
    print(
        "# byte-identical to the host kernels: "
        + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in same.items())
    )
    print(f"# MXNet: {mx['error'] if mx.get('error') else 'ran, ' + mx['mxnet']}")
    for stat, label in (("min_s", f"best of {args.repeat}"), ("mean_s", f"mean of {args.repeat}")):
        print(f"\n## {label}\n")
        print(table(n, ours, {} if mx.get("error") else mx, stat))
    if args.json:
        args.json.write_text(json.dumps({"n": n, "ours": ours, "identical": same, "mxnet": mx}, indent=1))
    return 0 if all(same.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
