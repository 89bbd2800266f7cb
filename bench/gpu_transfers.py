"""The bytes that cross PCIe per push and per pull of a cupy gradient, measured on the device.

    python -m bench.gpu_transfers                 # 1e7 float32, 10 steps each
    python -m bench.gpu_transfers --n 1e6 --steps 20 --json out.json

Needs cupy, a GPU and torch (its profiler reads CUPTI's record of every copy the driver made in
this process, cupy's too); without them it says which is missing and exits with status 2.

For each compression (none, 2-bit, 1-bit, top-k 1%), what a worker of the KV store does:

* push: ``WorkerCodec.encode`` of a cupy gradient (the CUDA encode, then the payload copied to
  page-locked host memory), or, uncompressed, the gradient copied to page-locked memory;
* pull: the server's payload (host memory) decoded into a cupy array (``kv.results.decode_into``:
  the payload sent up, unpacked on the device), or, uncompressed, the values copied up.

The table gives, per step, the copies and their bytes device-to-host and host-to-device as CUPTI
recorded them, beside the payload's size; and NVML's PCIe byte counters over the same steps where
the device exposes them (they count every transaction on the link, the driver's own too).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.compression_gpu import gpu_or_exit  # noqa: E402
from trainer_core.compression import get_compressor  # noqa: E402
from trainer_core.compression.codec import WorkerCodec  # noqa: E402
from trainer_core.kv.results import decode_into  # noqa: E402
from trainer_core.xp import host_to_device, pinned_empty  # noqa: E402

SCHEMES: tuple[dict[str, Any] | None, ...] = (
    None,
    {"type": "2bit", "threshold": 0.5},
    {"type": "1bit"},
    {"type": "topk", "ratio": 0.01},
)
NVML_TX, NVML_RX = 197, 198  # NVML_FI_DEV_PCIE_COUNT_TX_BYTES / _RX_BYTES


def needs() -> tuple[Any, Any]:
    """cupy (with a usable GPU: ``compression_gpu.gpu_or_exit``) and torch, or a message and exit
    status 2."""
    cupy = gpu_or_exit("gpu_transfers")
    try:
        import torch
    except ImportError as exc:
        print(f"gpu_transfers: {exc}; it needs torch (its profiler) beside cupy", file=sys.stderr)
        sys.exit(2)
    return cupy, torch


def nvml_counters() -> Any:
    """A function returning (tx, rx) bytes of the PCIe counters, or None where NVML has none."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)

        def read() -> tuple[int, int]:
            vals = pynvml.nvmlDeviceGetFieldValues(handle, [NVML_TX, NVML_RX])
            if any(v.nvmlReturn != 0 for v in vals):
                raise RuntimeError("NVML field not supported")
            return int(vals[0].value.ullVal), int(vals[1].value.ullVal)

        read()
        return read
    except Exception as exc:
        print(f"# NVML PCIe counters: not available ({type(exc).__name__}: {exc})")
        return None


def step_fns(cupy: Any, params: dict[str, Any] | None, g: Any) -> tuple[Any, Any, int]:
    """push(), pull() and the payload's bytes for one compression."""
    n = g.size
    out = cupy.empty_like(g)
    if params is None:
        host = pinned_empty(g.nbytes).view(np.float32)
        values = np.random.default_rng(1).standard_normal(n).astype(np.float32)
        return (lambda: g.get(out=host)), (lambda: host_to_device(values, out)), g.nbytes
    codec = WorkerCodec()
    codec.params = dict(params)
    server_payload, meta = get_compressor(params).encode(
        np.random.default_rng(1).standard_normal(n).astype(np.float32)
    )
    payload_bytes = int(np.asarray(server_payload).nbytes)
    return (
        (lambda: codec.encode("k", 0, g)),
        (lambda: decode_into(server_payload, meta, n, np.dtype(np.float32), out)),
        payload_bytes,
    )


def copies(torch: Any, fn: Any, steps: int, sync: Any) -> dict[str, float]:
    """CUPTI's memcpy records over ``steps`` calls of ``fn``: per step, count and bytes each way."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        sync()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text()).get("traceEvents", [])
    out = {"dtoh_copies": 0.0, "dtoh_bytes": 0.0, "htod_copies": 0.0, "htod_bytes": 0.0}
    for ev in events:
        name = str(ev.get("name", ""))
        if ev.get("cat") != "gpu_memcpy" and not name.startswith("Memcpy"):
            continue
        way = "dtoh" if "DtoH" in name else "htod" if "HtoD" in name else None
        if way is None:
            continue
        out[f"{way}_copies"] += 1 / steps
        out[f"{way}_bytes"] += float(ev.get("args", {}).get("bytes", 0)) / steps
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=float, default=1e7)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    n = int(args.n)
    if n < 1 or args.steps < 1:
        print("gpu_transfers: --n and --steps must be at least 1", file=sys.stderr)
        return 2
    cupy, torch = needs()
    sync = cupy.cuda.Device().synchronize
    nvml = nvml_counters()
    g = cupy.asarray(np.random.default_rng(0).standard_normal(n).astype(np.float32))
    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
    print(f"# bytes across PCIe per step, n = {n:.0e} float32 ({4 * n / 1e6:.0f} MB), {name}")
    rows = []
    for params in SCHEMES:
        label = "none" if params is None else params["type"]
        push, pull, payload = step_fns(cupy, params, g)
        for _ in range(2):  # warm: kernels built, residuals and pools made
            push(), pull()
        sync()
        row: dict[str, Any] = {"scheme": label, "payload_bytes": payload}
        for what, fn in (("push", push), ("pull", pull)):
            before = nvml() if nvml else None
            rec = copies(torch, fn, args.steps, sync)
            after = nvml() if nvml else None
            row[what] = rec
            if before and after:
                row[what]["nvml_tx_bytes"] = (after[0] - before[0]) / args.steps
                row[what]["nvml_rx_bytes"] = (after[1] - before[1]) / args.steps
        rows.append(row)
    print(
        "\n| compression | payload (bytes) | push: copies to host, bytes | to device, bytes | "
        "pull: copies to device, bytes | to host, bytes | NVML push tx / pull rx (bytes) |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        p, q = r["push"], r["pull"]
        nv = f"{p['nvml_tx_bytes']:.0f} / {q['nvml_rx_bytes']:.0f}" if "nvml_tx_bytes" in p else "n/a"
        print(
            f"| {r['scheme']} | {r['payload_bytes']} | {p['dtoh_copies']:.1f}, {p['dtoh_bytes']:.0f} | "
            f"{p['htod_bytes']:.0f} | {q['htod_copies']:.1f}, {q['htod_bytes']:.0f} | {q['dtoh_bytes']:.0f} | {nv} |"
        )
    if args.json:
        args.json.write_text(json.dumps({"n": n, "device": name, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
