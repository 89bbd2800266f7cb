"""The peer benchmark suite, in one command:

    python -m bench [--quick] [--only kv,kv_netns,compression,compressed_kv,allreduce,allreduce_hosts,launch,startup,output,accuracy]

Runs each benchmark side by side with its peers in one run (setting the peers up on first use:
MXNet 1.9.1 and torch's CPU wheel in venvs of their own), then regenerates the tables between
the ``<!-- bench:NAME -->`` markers of docs/performance.md and the plots in docs/img/.

| name | compares | needs |
|---|---|---|
| kv | trainer_core push+pull / pushpull vs MXNet 1.9.1 dist_sync vs raw pyzmq | |
| kv_netns | the same across three namespace hosts, 5 alternating runs | root |
| compression | trainer_core's compression kernels vs MXNet's 2-bit quantizer vs memcpy | |
| allreduce | trainer_core collective allreduce (default choice, ring, doubling) vs torch gloo all_reduce vs Open MPI MPI_Allreduce (mpi4py) vs trainer_core pushpull | mpirun, libopenmpi-dev (for mpi4py) |
| allreduce_hosts | trainer_core 32-bit and 1-bit compressed allreduce vs gloo vs Open MPI across three namespace hosts on 1 Gbit/s links, W = 3x1 and 3x2, against the ring's bound | root, mpirun |
| launch | launchkit over ssh vs one ssh at a time, 3 and 12 hosts | root (namespace hosts) |
| startup | launchkit + trainer_core vs MXNet's launch.py + MXNet: start to every worker's first KV call, W=8/S=8 | |
| output | 200,000 lines from 2 and 8 processes, run directly vs under launchkit, local and over ssh (loopback sshd) | root (ssh rows) |
| accuracy | 32-bit vs 1-bit vs 2-bit training on digits, bytes on the wire | |
| compressed_kv | compressed push+pull vs MXNet's 2-bit dist_sync | |
| capped_links | 1/2-bit vs 32-bit training step on 1 Gbit/s namespace links (not in the default list) | root |
| torch_step | trainer_core.torch step (allreduce, PS; 32/1-bit) vs torch DDP gloo, 4 workers, one host and 3 capped hosts (not in the default list) | root (hosts rows) |
| elastic | a worker's SIGKILL to the first step after it: trainer_core elastic vs torchrun --max-restarts vs launchkit --max-restarts, alternated (not in the default list) | |

Numbers on a shared machine are noisy: read the ratios, which come from one run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "performance.md"
IMG = ROOT / "docs" / "img"


def bench_args(name: str, quick: bool, out: str) -> list[str] | None:
    full = {
        "kv": ["--json", out],
        "compression": ["--json", out, "--repeat", "11"],
        "allreduce": ["--json", out],
        "allreduce_hosts": ["--json", out],
        "launch": ["--json", out],
        "accuracy": [],
        "compressed_kv": ["--json", out, "--repeat", "3"],
        "capped_links": ["--json", out, "--steps", "20"],
        "kv_netns": ["--json", out],
        "startup": ["--json", out],
        "output": ["--json", out] + ([] if os.geteuid() == 0 else ["--no-ssh"]),
        "torch_step": ["--json", out] + ([] if os.geteuid() == 0 else ["--no-hosts"]),
        "elastic": ["--runs", "3"],
    }
    fast = {
        "kv": ["--json", out, "--sizes", "1e3,1e5,1e6"],
        "compression": ["--json", out, "--repeat", "3", "--n", "1e6"],
        "allreduce": ["--json", out, "--workers", "2", "--sizes", "1e3", "1e5", "1e6", "--reps", "10"],
        "allreduce_hosts": ["--json", out, "--sizes", "1e6,1e7", "--reps", "2"],
        "launch": ["--json", out, "--repeat", "1"],
        "accuracy": ["--seeds", "1", "--epochs", "5"],
        "compressed_kv": ["--json", out, "--sizes", "1e6"],
        "capped_links": ["--json", out, "--steps", "5"],
        "kv_netns": ["--json", out, "--repeat", "1"],
        "startup": ["--json", out, "--repeat", "1"],
        "output": ["--json", out, "--repeat", "1"] + ([] if os.geteuid() == 0 else ["--no-ssh"]),
        "torch_step": ["--json", out, "--steps", "5"] + ([] if os.geteuid() == 0 else ["--no-hosts"]),
        "elastic": ["--runs", "1", "--warm", "5"],
    }
    return (fast if quick else full).get(name)


def run_one(name: str, quick: bool) -> tuple[str, Any]:
    """Run bench/NAME.py; returns its printed table and its JSON rows."""
    with tempfile.TemporaryDirectory() as d:
        out = str(Path(d) / "out.json")
        args = bench_args(name, quick, out)
        assert args is not None
        t0 = time.monotonic()
        res = subprocess.run(
            [sys.executable, "-m", f"bench.{name}", *args], cwd=ROOT, capture_output=True, text=True
        )
        took = time.monotonic() - t0
        if res.returncode != 0:
            return f"_failed (exit {res.returncode}):_\n\n```\n{res.stderr[-1500:]}\n```", None
        data = json.loads(Path(out).read_text()) if Path(out).exists() else None
    table = to_markdown(res.stdout)
    return table.strip() + f"\n\n_({took:.0f} s, {time.strftime('%Y-%m-%d %H:%M')} UTC)_", data


def to_markdown(stdout: str) -> str:
    """A benchmark's printout as Markdown: its tables, its ``# note`` lines in italics."""
    lines: list[str] = []
    for line in stdout.splitlines():
        if line.startswith("|"):
            lines.append(line)
        elif line.startswith("# "):
            lines += ["", f"_{line[2:].strip()}_", ""]
        elif not line.strip() and lines and lines[-1]:
            lines.append("")
    return "\n".join(lines)


def plot(name: str, data: Any) -> str | None:
    """A PNG for the results, or None (matplotlib missing, or nothing to plot)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    IMG.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4))
    if name == "kv" and data:
        for conf in sorted({r["config"] for r in data}):
            rows = [r for r in data if r["config"] == conf]
            ax.loglog(
                [r["n"] for r in rows],
                [r["ours_pushpull_ms"] for r in rows],
                "o-",
                label=f"trainer_core {conf}",
            )
            if all(r.get("mxnet_ms") for r in rows):
                ax.loglog([r["n"] for r in rows], [r["mxnet_ms"] for r in rows], "s--", label=f"MXNet {conf}")
        ax.set(xlabel="float32 elements", ylabel="push+pull round trip (ms)", title="KV store round trip")
    elif name == "allreduce" and data:
        for w in sorted({r["workers"] for r in data}):
            rows = [r for r in data if r["workers"] == w]
            ax.loglog(
                [r["size"] for r in rows],
                [r["trainer_core_ms"] for r in rows],
                "o-",
                label=f"trainer_core W={w}",
            )
            ax.loglog(
                [r["size"] for r in rows],
                [r["torch_gloo_ms"] for r in rows],
                "s--",
                label=f"torch gloo W={w}",
            )
        ax.set(xlabel="float32 elements", ylabel="ms per sum", title="Allreduce-equivalent")
    elif name == "launch" and data:
        xs = [str(r["hosts"]) for r in data]
        ax.bar([x + " launchkit" for x in xs], [r["launchkit_s"] for r in data])
        ax.bar([x + " one ssh at a time" for x in xs], [r["sequential_s"] for r in data])
        ax.set(ylabel="seconds to all workers running", title="Launch latency (namespace hosts)")
    elif name == "compression" and data:
        names, enc = [], []
        n = data["n"]
        for label, res in data.get("ours", {}).items():
            t = res.get("encode", {}).get("min_s") if isinstance(res, dict) else None
            if t:
                names.append(label)
                enc.append(4 * n / t / 1e9)
        for label, res in data.get("mxnet", {}).items():
            t = res.get("QuantizeCPU", {}).get("min_s") if isinstance(res, dict) else None
            if t:
                names.append(f"MXNet 2bit ({label})")
                enc.append(4 * n / t / 1e9)
        if not names:
            plt.close(fig)
            return None
        ax.barh(names, enc)
        ax.set(xlabel="encode GB/s of float32 input", title="Compression kernels")
    else:
        plt.close(fig)
        return None
    ax.legend(fontsize=7) if ax.get_legend_handles_labels()[0] else None
    fig.tight_layout()
    path = IMG / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"img/{path.name}"


def replace_block(doc: str, name: str, body: str) -> str:
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{start}\n{body}\n{end}"
    if start in doc and end in doc:
        return re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: block, doc, flags=re.S)
    return doc.rstrip() + f"\n\n### {name}\n\n{block}\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats (a smoke run)")
    ap.add_argument(
        "--only",
        default="kv,kv_netns,compression,compressed_kv,allreduce,allreduce_hosts,launch,startup,output,accuracy",
    )
    args = ap.parse_args()
    doc = DOC.read_text() if DOC.exists() else "# Performance\n"
    for name in args.only.split(","):
        if name in ("launch", "capped_links", "kv_netns", "allreduce_hosts") and os.geteuid() != 0:
            body = f"_skipped: the {name} benchmark builds namespace hosts and needs root_"
        else:
            print(f"[bench] {name} ...", file=sys.stderr, flush=True)
            table, data = run_one(name, args.quick)
            img = plot(name, data) if data is not None else None
            body = table + (f"\n\n![{name}]({img})" if img else "")
        print(f"\n## {name}\n\n{body}\n", flush=True)
        doc = replace_block(doc, name, body)
    DOC.write_text(doc)
    print(f"[bench] wrote {DOC.relative_to(ROOT)} and {IMG.relative_to(ROOT)}/", file=sys.stderr)


if __name__ == "__main__":
    main()
