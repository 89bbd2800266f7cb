"""Output merging: a job whose processes print as fast as they can, run directly and under
``launchkit launch``, locally and over ssh (a real sshd on loopback, as in the tests).

    python -m bench.output [--lines 200000] [--procs 2 8] [--repeat 3] [--json out.json]

``--lines`` lines in all (about 60 bytes each, ``print`` with ``PYTHONUNBUFFERED=1`` as launchkit
sets it) are split between ``--procs`` worker processes. Each row is one place the merged output
goes: ``/dev/null``, a file, a pipe (``| cat > /dev/null``), and ``--log-dir`` (plus ``/dev/null``).

- *direct*: the same processes started by a shell (``python3 chatty.py &`` ... ``wait``), their
  output to the same place (with ``--log-dir``: each to a file of its own); over ssh, one
  ``ssh host python3 chatty.py`` per process (the system OpenSSH client);
- *launchkit*: ``launchkit launch -n P -s 0 ...`` (only the workers run), wall time;
- every process, direct or under launchkit, waits until one start time given on its command line
  (``LEAD`` seconds after the command is started, enough for every start-up) and only then prints:
  all of them print at once in both cases. Without it, the direct ssh sessions start one after
  another as their handshakes finish, so their processes hardly overlap, while launchkit starts
  them together: the slowest process's own time then compares unlike things;
- *fixed cost*: the same command with no lines printed (start-up, the wait, connection,
  teardown), for each side;
- *wall ratio*: (launchkit - its fixed cost) / (direct - its fixed cost);
- *job*: the slowest worker's own time from its first to its last line (the back-pressure a slow
  merger puts on the job shows here), under launchkit beside the same direct; *job ratio*: the
  two, the figure the issue asks about.

Medians of ``--repeat`` runs. Needs root for the ssh rows (sshd on loopback, root login by key).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHATTY = """\
import os, sys, time
n = int(sys.argv[1])
if os.environ.get("DMLC_ROLE", "worker") == "worker":
    start = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    time.sleep(max(0.0, start - time.time()))  # every process begins at the same moment
    t0 = time.time()
    for i in range(n):
        print(f"step {i:7d} loss 0.{i % 9973:04d} lr 0.0100 throughput 1234.5 samples/s")
    t1 = time.time()
    if len(sys.argv) > 2:
        with open(sys.argv[2], "a") as f:
            f.write(f"{t0 - start} {t1 - t0}\\n")
"""
LEAD = {"local": 1.5, "ssh": 2.5}  # seconds from starting a command to its processes' common start
TARGETS = ("/dev/null", "file", "pipe", "--log-dir")


def redirect(target: str, d: Path) -> str:
    if target == "file":
        return f"> {d}/merged.out"
    if target == "pipe":
        return "| cat > /dev/null"
    return "> /dev/null"


def timed(cmd: str, env: dict[str, str]) -> float:
    t0 = time.monotonic()
    res = subprocess.run(
        ["bash", "-c", cmd], env=env, cwd="/", stderr=subprocess.PIPE, text=True, timeout=600
    )
    took = time.monotonic() - t0
    if res.returncode != 0:
        raise SystemExit(f"failed ({res.returncode}): {cmd}\n{res.stderr[-2000:]}")
    return took


def job_time(path: Path) -> float:
    """The slowest process's own time (each writes how late it began and how long it printed)."""
    rows = [line.split() for line in path.read_text().splitlines()] if path.exists() else []
    path.unlink(missing_ok=True)
    late = max((float(r[0]) for r in rows), default=0.0)
    if late > 0.05:
        print(f"[bench] a process began {late:.2f} s after the common start", file=sys.stderr, flush=True)
    return max((float(r[1]) for r in rows), default=0.0)


def direct_cmd(procs: int, each: int, target: str, d: Path, ssh: list[str] | None, start: float) -> str:
    prog = f"python3 {d}/chatty.py {each} {d}/times {start:.3f}"
    parts = []
    for i in range(procs):
        one = (
            prog if ssh is None else shlex.join([*ssh, f"cd / && PYTHONUNBUFFERED=1 DMLC_ROLE=worker {prog}"])
        )
        if target == "--log-dir":
            one += f" > {d}/logs/direct-{i}.stdout 2> {d}/logs/direct-{i}.stderr"
        parts.append(f"{one} &")
    body = " ".join(parts) + " wait"
    return f"( {body} ) {redirect(target, d)}" if target != "--log-dir" else f"( {body} )"


def launch_cmd(procs: int, each: int, target: str, d: Path, hosts: list[str], start: float) -> str:
    argv = [sys.executable, "-m", "launchkit", "launch", "-n", str(procs), "-s", "0", *hosts]
    if target == "--log-dir":
        argv += ["--log-dir", f"{d}/logs"]
    argv += ["python3", f"{d}/chatty.py", str(each), f"{d}/times", f"{start:.3f}"]
    return f"{shlex.join(argv)} {redirect(target, d)}"


def print_table(rows: list[dict[str, object]], lines: int, repeat: int) -> None:
    print(
        f"# {lines} lines in all (~64 bytes each) from P processes, all starting at once; medians of {repeat};"
    )
    print(
        "# seconds. wall ratio: (launchkit - its fixed cost) / (direct - its fixed cost); job ratio: the "
        "slowest worker's own time, under launchkit / direct"
    )
    print(
        "| where | P | output to | direct | launchkit | fixed cost (direct / launchkit) | wall ratio "
        "| job direct | job under launchkit | job ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        d, o, f = float(r["direct_s"]), float(r["launchkit_s"]), float(r["fixed_s"])  # type: ignore[arg-type]
        df = float(r.get("direct_fixed_s", 0.0))  # type: ignore[arg-type]
        jd, jo = float(r["job_direct_s"]), float(r["job_launchkit_s"])  # type: ignore[arg-type]
        print(
            f"| {r['mode']} | {r['procs']} | `{r['target']}` | {d:.2f} | {o:.2f} | {df:.2f} / {f:.2f} "
            f"| {(o - f) / (d - df):.2f}x | {jd:.2f} | {jo:.2f} | {jo / jd:.2f}x |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--procs", type=int, nargs="+", default=[2, 8])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-ssh", action="store_true", help="only the local rows")
    ap.add_argument("--json", help="also write the raw numbers here")
    ap.add_argument("--table", help="only print the table of an earlier run's --json file")
    args = ap.parse_args()
    if args.table:
        print_table(json.loads(Path(args.table).read_text()), args.lines, args.repeat)
        return
    rows: list[dict[str, object]] = []
    sshd = None
    with tempfile.TemporaryDirectory(prefix="lk-bench-out-") as tmp:
        d = Path(tmp)
        (d / "chatty.py").write_text(CHATTY)
        (d / "logs").mkdir()
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "LAUNCHKIT_HOME": str(d / "home"),
            "PYTHONUNBUFFERED": "1",
        }
        modes: list[tuple[str, list[str] | None, list[str]]] = [("local", None, ["--launcher", "local"])]
        if not args.no_ssh:
            from tests.cluster.sshd import LoopbackSshd

            sshd = LoopbackSshd.start()
            (d / "hosts").write_text(sshd.hostfile_line() + "\n")
            ssh = ["ssh", *sshd.ssh_options(), f"{sshd.user}@{sshd.host}"]
            subprocess.run([*ssh, "true"], check=True, capture_output=True)  # known_hosts filled
            hosts = ["-H", str(d / "hosts"), "-i", str(sshd.identity), "--known-hosts", str(sshd.known_hosts)]
            modes.append(("ssh", ssh, hosts))
        try:
            for mode, remote, hosts in modes:
                lead = LEAD[mode]
                for procs in args.procs:
                    each = args.lines // procs
                    fixed = statistics.median(
                        timed(launch_cmd(procs, 0, "/dev/null", d, hosts, time.time() + lead), env)
                        for _ in range(args.repeat)
                    )
                    direct_fixed = statistics.median(
                        timed(direct_cmd(procs, 0, "/dev/null", d, remote, time.time() + lead), env)
                        for _ in range(args.repeat)
                    )
                    for target in TARGETS:
                        direct, ours, dj, oj = [], [], [], []
                        for _ in range(args.repeat):
                            direct.append(
                                timed(direct_cmd(procs, each, target, d, remote, time.time() + lead), env)
                            )
                            dj.append(job_time(d / "times"))
                            ours.append(
                                timed(launch_cmd(procs, each, target, d, hosts, time.time() + lead), env)
                            )
                            oj.append(job_time(d / "times"))
                        row = {
                            "mode": mode,
                            "procs": procs,
                            "target": target,
                            "direct_s": statistics.median(direct),
                            "launchkit_s": statistics.median(ours),
                            "fixed_s": fixed,
                            "direct_fixed_s": direct_fixed,
                            "job_direct_s": statistics.median(dj),
                            "job_launchkit_s": statistics.median(oj),
                        }
                        rows.append(row)
                        print(f"[bench] {row}", file=sys.stderr, flush=True)
        finally:
            if sshd is not None:
                sshd.stop()
    print_table(rows, args.lines, args.repeat)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
