"""Allreduce across three namespace hosts with every link capped at 1 Gbit/s (root).

    python -m bench.allreduce_hosts [--layouts 3x1,3x2] [--sizes 1e5,1e6,1e7] [--reps 5]
                                    [--peers gloo,mpi] [--rate 1gbit] [--json OUT]

Three network-namespace hosts (``tests.cluster.netns.HostGroup``), every veth end capped with
``tbf`` and checked with one TCP stream each way (``bench.capped_links.cap`` and
``stream_gbps``). W = 3 hosts x 1 and 3 x 2 workers, float32 arrays of ones, side by side:

* trainer_core's collective allreduce, 32-bit (its default choice: the ring across hosts, or the
  hierarchical path with 2 workers per host) and 1-bit compressed with error feedback
  (``Group.compressed_allreduce``, ``{"type": "1bit"}``), in a ``launchkit launch -s 0`` job over
  ssh (bench/allreduce_hosts_workers.py);
* torch 2.13's gloo ``all_reduce`` (env://, MASTER_ADDR/PORT from the same launcher), where torch
  imports on the hosts;
* Open MPI's ``MPI_Allreduce`` through mpi4py, ``mpirun`` over ssh to the hosts, where it runs.

The hosts' /root and /tmp are private, so their interpreter is a venv in /var/tmp made from
Debian's ``/usr/bin/python3`` (the same 3.11 as this one) that sees this interpreter's
site-packages through a ``.pth`` file (numpy, pyzmq, numba, torch), with mpi4py installed into
it (``pip install mpi4py``: needs libopenmpi-dev). The ring's bound for S bytes over n hosts on
links of L bytes/s is 2 (n-1)/n S / L (every host sends and receives that much at once); the
table gives each time's share of it (bound / time: 1.0 is the link's full rate), and the 1-bit /
32-bit speedup. Rank 0's numbers, medians of back-to-back operations.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench import allreduce_hosts_workers as programs  # noqa: E402
from bench.capped_links import cap, stream_gbps  # noqa: E402
from tests.cluster.netns import HostGroup  # noqa: E402

VENV = Path(os.environ.get("LAUNCHKIT_BENCH_HOSTS_VENV", "/var/tmp/launchkit-bench-hosts-venv"))
WARMUP = 2
THREADS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
#: Open MPI's tuned allreduce forced to its ring (its default choice for 3 ranks moves ~1.7x the bytes)
MPI_RING = ("--mca", "coll_tuned_use_dynamic_rules", "1", "--mca", "coll_tuned_allreduce_algorithm", "4")
RESULT = re.compile(r"RESULT (\{.*\})")


def hosts_python() -> tuple[str, bool, bool]:
    """The hosts' interpreter, and whether torch and mpi4py import in it."""
    py = VENV / "bin" / "python"
    if not py.exists():
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--clear", str(VENV)], check=True)
        site = subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        Path(site, "launchkit-bench.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(py), "-c", "import numpy, zmq"], check=True)
    ok = lambda mod: subprocess.run([str(py), "-c", f"import {mod}"], capture_output=True).returncode == 0  # noqa: E731
    if not ok("mpi4py") and shutil.which("mpirun"):
        print(f"installing mpi4py into {VENV} ...", file=sys.stderr, flush=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "mpi4py"], capture_output=True)
    return str(py), ok("torch"), ok("mpi4py.MPI")


def job_dir(root: Path) -> Path:
    d = root / "job"
    d.mkdir()
    for pkg in ("trainer_core", "dmlc_env"):
        shutil.copytree(REPO / pkg, d / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (d / "tc.py").write_text(programs.TC)
    (d / "gloo.py").write_text(programs.GLOO)
    return d


def _result(proc: subprocess.CompletedProcess[str], what: str) -> dict:
    m = RESULT.search(proc.stdout)
    if proc.returncode != 0 or m is None:
        raise RuntimeError(
            f"{what} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        )
    out: dict = json.loads(m.group(1))
    return out


def launch(
    group: HostGroup, root: Path, workers: int, python: str, script: str, spec: list[str], servers: int = 0
) -> dict:
    hostfile = group.write_hostfile(root / "hosts")
    env_flags = [a for k in THREADS for a in ("--env", f"{k}:1")] + ["--env", "GLOO_SOCKET_IFNAME:eth0"]
    argv = [
        sys.executable,
        "-m",
        "launchkit",
        "launch",
        "-H",
        str(hostfile),
        "-i",
        str(group.identity),
        "--known-hosts",
        str(group.known_hosts),
        "--sync-dst-dir",
        "/srv/arjob",
        "-n",
        str(workers),
        "-s",
        str(servers),
        *env_flags,
        python,
        script,
        *spec,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_", "LAUNCHKIT_", "PYTHON"))}
    env["LAUNCHKIT_HOME"] = str(root / "home")
    proc = subprocess.run(argv, cwd=root / "job", env=env, capture_output=True, text=True, timeout=900)
    return _result(proc, f"{script} with {workers} workers")


def mpirun(
    group: HostGroup, root: Path, per_host: int, python: str, spec: list[str], mca: tuple[str, ...] = ()
) -> dict:
    script = Path(tempfile.mkdtemp(prefix="lk-mpi-", dir="/var/tmp")) / "mpi.py"  # the hosts see /var/tmp
    script.write_text(programs.MPI)
    rsh = f"-i {group.identity} -o UserKnownHostsFile={group.known_hosts} -o StrictHostKeyChecking=accept-new"
    hosts = ",".join(f"{h.address}:{per_host}" for h in group)
    argv = [
        "mpirun",
        "--allow-run-as-root",
        "--oversubscribe",
        "--bind-to",
        "none",
        "-H",
        hosts,
        "-n",
        str(per_host * len(group)),
        "--map-by",
        "node",
        "--mca",
        "plm_rsh_args",
        rsh + " -o BatchMode=yes",
        "--mca",
        "mpi_yield_when_idle",
        "1",
        "--mca",
        "oob_tcp_if_include",
        "10.231.0.0/24",
        "--mca",
        "btl_tcp_if_include",
        "10.231.0.0/24",
        *mca,
        *[a for k in THREADS for a in ("-x", f"{k}=1")],
        python,
        str(script),
        *spec,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "LAUNCHKIT_", "PS_", "PYTHON"))}
    try:
        return _result(subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env), "mpirun")
    finally:
        shutil.rmtree(script.parent, ignore_errors=True)


def measure(args: argparse.Namespace) -> dict:
    python, has_torch, has_mpi = hosts_python()
    sizes = [str(int(float(s))) for s in args.sizes.split(",")]
    spec = [",".join(sizes), str(args.reps), str(WARMUP)]
    info: dict = {"python": python, "rate": args.rate, "rows": []}
    with tempfile.TemporaryDirectory(prefix="lk-arhosts-") as d:
        root = Path(d)
        job_dir(root)
        (root / "home").mkdir()
        group = HostGroup.create(3)
        try:
            if args.rate != "none":
                cap(group, args.rate, args.burst, args.latency)
            info["stream_gbps"] = {
                "node1->node2": stream_gbps(group, 0, 1),
                "node2->node1": stream_gbps(group, 1, 0),
            }
            print(f"link check: {info['stream_gbps']}", file=sys.stderr, flush=True)
            for layout in args.layouts.split(","):
                nhosts, per_host = (int(v) for v in layout.split("x"))
                assert nhosts == len(group), "three hosts"
                w = nhosts * per_host
                print(f"[{layout}] trainer_core ...", file=sys.stderr, flush=True)
                res = {"layout": layout, **launch(group, root, w, python, "tc.py", spec)}
                if has_torch and "gloo" in args.peers:
                    print(f"[{layout}] gloo ...", file=sys.stderr, flush=True)
                    res.update(_try("gloo", launch, group, root, w, python, "gloo.py", spec))
                if has_mpi and "mpi" in args.peers:
                    print(f"[{layout}] Open MPI ...", file=sys.stderr, flush=True)
                    res.update(_try("Open MPI", mpirun, group, root, per_host, python, spec))
                    ring = _try("Open MPI ring", mpirun, group, root, per_host, python, spec, MPI_RING)
                    res.update({k.replace("mpi", "mpiring"): v for k, v in ring.items() if k != "library"})
                info["rows"].append(res)
        finally:
            group.close()
    info["sizes"] = [int(s) for s in sizes]
    info["torch"], info["mpi"] = has_torch, has_mpi
    return info


def _try(what: str, fn: Callable[..., dict], *args: Any) -> dict:
    """``fn(*args)``, or {} (and why, on stderr) where that peer does not run."""
    try:
        out: dict = fn(*args)
        return out
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"{what} did not run: {str(e)[-1500:]}", file=sys.stderr, flush=True)
        return {}


def table(info: dict, link_bytes_s: float) -> str:
    """Markdown: the times against the ring's bound, then where trainer_core's time goes."""
    ms = lambda v: "n/a" if v is None else f"{v * 1e3:.1f}"  # noqa: E731
    share = lambda bound, v: "n/a" if v is None else f"{bound / v:.2f}"  # noqa: E731
    lib = next((r["library"] for r in info["rows"] if "library" in r), "Open MPI not measured")
    streams = ", ".join(f"{k} {v:.3f} Gbit/s" for k, v in info["stream_gbps"].items())
    lines = [
        f"# three namespace hosts, tbf {info['rate']} on every veth end (one TCP stream: {streams}); {lib}",
        "# bound = the ring's 2(n-1)/n * bytes / link (n = 3 hosts, link = the tbf rate); share = bound / time"
        " (1.00: the link's full rate); median ms of rank 0",
        "",
        "| W (hosts x workers) | float32 elements | bound ms | tc 32-bit ms [algorithm] | share | tc 1-bit ms "
        "| 1-bit speedup | gloo ms | share | Open MPI ms | share | Open MPI ring ms | share |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in info["rows"]:
        for n in info["sizes"]:
            bound = 2 * 2 / 3 * 4 * n / link_bytes_s
            t32, t1 = r.get(f"tc32/{n}"), r.get(f"tc1/{n}")
            gloo, mpi, mring = r.get(f"gloo/{n}"), r.get(f"mpi/{n}"), r.get(f"mpiring/{n}")
            speed = "n/a" if not (t32 and t1) else f"{t32 / t1:.1f}x"
            lines.append(
                f"| {r['layout']} | {n:.0e} | {bound * 1e3:.1f} | {ms(t32)} [{r.get(f'algorithm/{n}')}] "
                f"| {share(bound, t32)} | {ms(t1)} | {speed} | {ms(gloo)} | {share(bound, gloo)} | {ms(mpi)} "
                f"| {share(bound, mpi)} | {ms(mring)} | {share(bound, mring)} |"
            )
    lines += [
        "",
        "# where trainer_core's time goes: bytes on rank 0's host's eth0 per operation (both ways), the CPU"
        " time of every rank per operation summed / the time (cores kept busy; this machine has"
        f" {os.cpu_count()}), and two local costs timed on every rank at once: a float32 add of the array,"
        " 1-bit encode + decode of the array",
        "",
        "| W | float32 elements | 32-bit eth0 MB/op | 1-bit eth0 MB/op | 32-bit cores busy | 1-bit cores busy "
        "| float32 add ms | 1-bit encode+decode ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in info["rows"]:
        for n in info["sizes"]:
            lines.append(
                f"| {r['layout']} | {n:.0e} | {r[f'tc32_bytes/{n}'] / 1e6:.2f} | {r[f'tc1_bytes/{n}'] / 1e6:.2f} "
                f"| {_busy(r, 'tc32', n)} | {_busy(r, 'tc1', n)} | {ms(r.get(f'add/{n}'))} | {ms(r.get(f'codec/{n}'))} |"
            )
    return "\n".join(lines)


def _busy(row: dict, key: str, n: int) -> str:
    return f"{row[f'cpu_{key}/{n}'] / row[f'{key}/{n}']:.2f}"


def rate_bytes(rate: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate.lower())
    if not m:
        raise SystemExit(f"--rate: a tc rate like 1gbit or 100mbit, not {rate!r}")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layouts", default="3x1,3x2", help="HOSTSxWORKERS, comma-separated (3 hosts)")
    ap.add_argument("--sizes", default="1e5,1e6,1e7")
    ap.add_argument("--reps", type=int, default=5, help="timed operations per size (4x that below 1e6)")
    ap.add_argument("--peers", default="gloo,mpi", help="which peers besides trainer_core (gloo, mpi)")
    ap.add_argument("--rate", default="1gbit", help="tbf rate on every veth end")
    ap.add_argument("--burst", default="256kb")
    ap.add_argument("--latency", default="50ms")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    link = rate_bytes(args.rate)
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces, tc)")
    info = measure(args)
    print(table(info, link))
    if args.json:
        Path(args.json).write_text(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
