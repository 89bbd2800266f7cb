"""Time per training step of a torch model: trainer_core.torch (allreduce and parameter server,
32-bit and 1-bit) vs torch's DistributedDataParallel with gloo, 4 workers, side by side in one run.

    python -m bench.torch_step [--models cnn,mlp] [--steps 20] [--no-hosts] [--rate 1gbit] [--json OUT]

Two models (bench/torch_step_workers.py): examples/train_torch.py's small CNN (14k parameters,
where a step is mostly fixed costs) and an MLP of 4.2M parameters (16.8 MB of float32 gradients per
step, where communication matters). Two places:

* one host: ``launchkit launch --launcher local -n 4 -s 0`` (allreduce, and DDP) or ``-s 1``
  (parameter server, one server), every process one thread;
* three namespace hosts with every link capped (root): bench.allreduce_hosts's hosts, venv and
  ``launch`` (``-n 4 -s 0`` over ssh: 2 workers on the first host), capped by
  bench.capped_links.``cap``; the parameter-server path is not run there.

Rank 0's median step (forward, backward, exchange, update) after warm-up steps.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench import allreduce_hosts  # noqa: E402
from bench.capped_links import cap, stream_gbps  # noqa: E402
from bench.torch_step_workers import STEP  # noqa: E402

WORKERS, WARMUP = 4, 3
#: (column, program kind, servers, compression)
RUNS = (
    ("tc allreduce 32-bit", "tc", 0, "none"),
    ("tc allreduce 1-bit", "tc", 0, "1bit"),
    ("tc ps 32-bit", "tc", 1, "none"),
    ("tc ps 1-bit", "tc", 1, "1bit"),
    ("DDP gloo", "ddp", 0, "none"),
)


def write_programs(job: Path) -> None:
    (job / "step.py").write_text(STEP)
    shutil.copy(REPO / "examples" / "train_torch.py", job / "train_torch.py")


def local(job: Path, servers: int, spec: list[str]) -> dict:
    threads = [a for k in allreduce_hosts.THREADS for a in ("--env", f"{k}:1")]
    argv = [
        sys.executable,
        "-m",
        "launchkit",
        "launch",
        "--launcher",
        "local",
        "-n",
        str(WORKERS),
        "-s",
        str(servers),
        *threads,
        sys.executable,
        "step.py",
        *spec,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_", "LAUNCHKIT_"))}
    env["PYTHONPATH"] = str(REPO)
    env["LAUNCHKIT_HOME"] = str(job.parent / "home")
    proc = subprocess.run(argv, cwd=job, env=env, capture_output=True, text=True, timeout=600)
    return allreduce_hosts._result(proc, f"step.py {' '.join(spec)} -s {servers}")


def measure(args: argparse.Namespace) -> dict:
    info: dict = {"rows": [], "rate": args.rate}
    models = args.models.split(",")
    with tempfile.TemporaryDirectory(prefix="lk-torchstep-") as d:
        root = Path(d)
        job = root / "job"
        job.mkdir()
        write_programs(job)
        for model in models:
            row: dict = {"model": model, "where": "one host"}
            for col, kind, servers, comp in RUNS:
                print(f"[one host] {model}: {col} ...", file=sys.stderr, flush=True)
                res = allreduce_hosts._try(
                    col, local, job, servers, [kind, model, comp, str(args.steps), str(WARMUP)]
                )
                row[col], row["params"] = res.get("step_s"), res.get("params", row.get("params"))
                row.setdefault("threads", {})[col] = res.get("threads")
            info["rows"].append(row)
        if args.no_hosts:
            return info
        python, has_torch, _ = allreduce_hosts.hosts_python()
        if not has_torch:
            raise SystemExit(f"torch does not import in {python}")
        hroot = root / "hosts"
        hroot.mkdir()
        write_programs(allreduce_hosts.job_dir(hroot))
        (hroot / "home").mkdir()
        group = allreduce_hosts.HostGroup.create(3)
        try:
            cap(group, args.rate, "256kb", "50ms")
            info["stream_gbps"] = stream_gbps(group, 0, 1)
            for model in models:
                row = {"model": model, "where": f"3 hosts, {args.rate} links"}
                for col, kind, servers, comp in RUNS:
                    print(f"[hosts] {model}: {col} ...", file=sys.stderr, flush=True)
                    spec = [kind, model, comp, str(args.steps), str(WARMUP)]
                    res = allreduce_hosts._try(
                        col, allreduce_hosts.launch, group, hroot, WORKERS, python, "step.py", spec, servers
                    )
                    row[col], row["params"] = res.get("step_s"), res.get("params", row.get("params"))
                info["rows"].append(row)
        finally:
            group.close()
    return info


def table(info: dict) -> str:
    cols = [c for c, *_ in RUNS]
    ms = lambda v: "n/a" if v is None else f"{v * 1e3:.1f}"  # noqa: E731
    threads = sorted({t for r in info["rows"] for t in r.get("threads", {}).values() if t is not None})
    lines = [
        f"# {WORKERS} workers, 16 samples each per step, median ms of rank 0's steps; ratio = DDP / trainer_core"
        + (f"; torch threads per worker: {', '.join(map(str, threads))}" if threads else "")
        + (
            f"; capped links: one TCP stream {info['stream_gbps']:.3f} Gbit/s"
            if "stream_gbps" in info
            else ""
        ),
        "",
        "| model (parameters) | where | "
        + " | ".join(f"{c} ms" for c in cols)
        + " | DDP / tc 32-bit allreduce | DDP / tc 1-bit allreduce |",
        "|---|---|" + "---|" * (len(cols) + 2),
    ]
    for r in info["rows"]:
        ddp, t32, t1 = r.get("DDP gloo"), r.get(cols[0]), r.get(cols[1])
        lines.append(
            f"| {r['model']} ({(r['params'] or 0) / 1e6:.2f}M) | {r['where']} | "
            + " | ".join(ms(r.get(c)) for c in cols)
            + f" | {_ratio(ddp, t32)} | {_ratio(ddp, t1)} |"
        )
    return "\n".join(lines)


def _ratio(ddp: float | None, t: float | None) -> str:
    return "n/a" if not (ddp and t) else f"{ddp / t:.2f}x"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="cnn,mlp", help="cnn (the example's), mlp (4.2M parameters)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--no-hosts", action="store_true", help="one host only (no root needed)")
    ap.add_argument("--rate", default="1gbit", help="tbf rate on every veth end")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    if not args.no_hosts and os.geteuid() != 0:
        raise SystemExit("the capped hosts need root (network namespaces, tc); --no-hosts for one host")
    info = measure(args)
    print(table(info))
    if args.json:
        Path(args.json).write_text(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
