"""Output at scale: every process of a 128-host job printing at once, through
launchkit, pdsh and mpirun, on the same namespace hosts, in one run.

    sudo python -m bench.scale_output [--hosts 128] [--per-host 8] [--lines 200 0] [--repeat 2]

Each process (``python3 -S -c CHATTY START LINES``) waits until ``START`` (a time every tool has
started all of its processes by: ``--lead`` seconds after the tool is started), prints ``LINES``
lines of 80 bytes as fast as it can (``print``, unbuffered), then ends. ``LINES`` 0 is each
tool's fixed cost (the wait, its end); the difference is what the output costs it.

- **launchkit**: ``launchkit launch -H HOSTS -n P -s 0 --no-dashboard`` (only workers), its
  merged output to a file (each line prefixed with the process's name, its kept output written
  as by default);
- **pdsh**: ``pdsh -R ssh -f HOSTS -w HOSTS 'for ...; do python3 ... & done; wait'`` (its
  window as large as the hosts: with its default 32, only 32 hosts would print at once), its
  output (each line prefixed with the host) to a file;
- **mpirun**: Open MPI's ``mpirun`` with P ranks (its daemons forward each rank's output up
  its tree), to a file.

Per tool and line count: the time from ``START`` until the tool has exited, the machine's busy
CPU seconds in that time (``/proc/stat``: every process of every host is on this machine), and
how many of the lines are not in the file whole (missing, cut, or merged with another
process's: a tool that forwards bytes, not lines, merges the two writes of an unbuffered
``print``; for launchkit any fails the run), and no process late for ``START``. Medians of ``--repeat`` rounds, the
tools in turn (their order rotates each round). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.scale import ensure_pdsh, launch_argv, mpirun_argv, pdsh_argv, pdsh_round, quiet  # noqa: E402
from bench.scale_trace import machine_busy  # noqa: E402
from tests.cluster.netns import HostGroup  # noqa: E402

WIDTH = 80  # bytes of each printed line, its newline included
CHATTY = (
    "import os,sys,time\n"
    "start, n = float(sys.argv[1]), int(sys.argv[2])\n"
    "late = time.time() > start\n"
    "time.sleep(max(0.0, start - time.time()))\n"
    "me = '%s.%d.%s' % (os.uname().nodename, os.getpid(), os.urandom(3).hex())\n"
    "print('LATE' if late else 'ONTIME', me)\n"
    "for i in range(n):\n"
    "    line = 'L %s %d ' % (me, i)\n"
    "    print(line + 'x' * (WIDTH - 2 - len(line)) + '#')\n"
).replace("WIDTH", str(WIDTH))  # each line WIDTH bytes with its newline
LINE = re.compile(rb"(?:^|\s)(L (\S+) (\d+) x+#)$")


def chatty(start: float, lines: int) -> list[str]:
    return ["python3", "-S", "-u", "-c", CHATTY, f"{start:.3f}", str(lines)]


def check(path: Path, procs: int, lines: int) -> int:
    """How many of the ``procs`` x ``lines`` lines are not in ``path`` whole (missing, cut, or
    merged with another process's, which a tool that forwards bytes rather than lines does when a
    process writes a line in two writes, as ``print`` does unbuffered). Raises if a process was
    late for ``START`` or never printed (the run does not measure what it says)."""
    whole = ontime = 0
    with path.open("rb") as f:
        for raw in f:
            text = raw.rstrip(b"\n")
            if b"LATE" in text:
                raise RuntimeError(f"{path}: a process started after START: raise --lead")
            ontime += text.count(b"ONTIME")  # (one write of print: whole even where merged)
            m = LINE.search(text)
            whole += m is not None and len(m.group(1)) == WIDTH - 1
    if ontime != procs:
        raise RuntimeError(f"{path}: {ontime} of {procs} processes printed")
    return procs * lines - whole


def run(argv: list[str], out: Path, start: float, env: dict[str, str] | None = None) -> tuple[float, float]:
    """Run a tool, its output to ``out``; (seconds from ``start`` to its exit, the machine's busy
    CPU seconds from ``start`` to its exit)."""
    with out.open("wb") as f:
        proc = subprocess.Popen(
            argv, stdout=f, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
        time.sleep(max(0.0, start - time.time()))
        busy0 = machine_busy()
        _, err = proc.communicate(timeout=600)
        ended, busy = time.time(), machine_busy()
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[:3]} exited {proc.returncode}: {err.decode(errors='replace')[-2000:]}")
    return ended - start, busy - busy0


def launchkit(
    group: HostGroup, hostfile: Path, home: str, procs: int, start: float, lines: int, out: Path
) -> tuple[float, float]:
    argv = launch_argv(group, hostfile, procs, chatty(start, lines))
    return run(argv, out, start, {**os.environ, "LAUNCHKIT_HOME": home})


def pdsh(group: HostGroup, per_host: int, start: float, lines: int, out: Path) -> tuple[float, float]:
    one = shlex.join(chatty(start, lines))
    argv, env = pdsh_argv(group, f"for i in $(seq {per_host}); do {one} & done; wait", fanout=len(group))
    return run(argv, out, start, env)


def mpirun(group: HostGroup, per_host: int, start: float, lines: int, out: Path) -> tuple[float, float]:
    return run(mpirun_argv(group, per_host, chatty(start, lines)), out, start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=128)
    ap.add_argument("--per-host", type=int, default=8)
    ap.add_argument("--lines", type=int, nargs="+", default=[200, 0], help="lines each process prints")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--lead", type=float, default=40.0, help="seconds from a tool's start to START")
    ap.add_argument("--tools", nargs="+", default=["launchkit", "pdsh", "mpirun"])
    ap.add_argument("--json", help="also write the rounds as JSON here")
    ap.add_argument("--keep", metavar="DIR", help="move an output that fails its check here")
    args = ap.parse_args()
    ensure_pdsh()
    procs = args.hosts * args.per_host
    rounds: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as home:
        group = HostGroup.create(args.hosts)
        try:
            hostfile = group.write_hostfile(Path(home) / "hosts", slots=args.per_host)
            pdsh_round(group)  # every host's key recorded (the known_hosts file is shared by every tool)
            for i in range(args.repeat):
                row: dict[str, float] = {}
                tools = args.tools[i % len(args.tools) :] + args.tools[: i % len(args.tools)]
                for lines in args.lines:
                    for tool in tools:
                        quiet()
                        start = time.time() + args.lead
                        out = Path(home) / f"{tool}-{lines}.out"
                        if tool == "launchkit":
                            took = launchkit(group, hostfile, home, procs, start, lines, out)
                        elif tool == "pdsh":
                            took = pdsh(group, args.per_host, start, lines, out)
                        else:
                            took = mpirun(group, args.per_host, start, lines, out)
                        bad = check(out, procs, lines)
                        if bad and tool == "launchkit":  # its merger keeps each process's lines whole
                            if args.keep:
                                out.rename(Path(args.keep) / out.name)
                            raise RuntimeError(f"launchkit: {bad} lines not whole in its output")
                        row[f"{tool} {lines} lines: not whole"] = bad
                        row[f"{tool} {lines} lines: s"], row[f"{tool} {lines} lines: machine CPU s"] = took
                        out.unlink()
                rounds.append(row)
                print(json.dumps({"round": i, **row}), flush=True)
        finally:
            group.close()
    print(f"\n{args.hosts} hosts x {args.per_host}: {procs} processes, {args.lines} lines of {WIDTH} B each")
    print("| tool | lines a process | s from START to exit | machine CPU s | lines not whole (of all) |")
    print("|---|---|---|---|---|")
    for tool in args.tools:
        for lines in args.lines:
            s = statistics.median(r[f"{tool} {lines} lines: s"] for r in rounds)
            cpu = statistics.median(r[f"{tool} {lines} lines: machine CPU s"] for r in rounds)
            bad = ", ".join(str(int(r[f"{tool} {lines} lines: not whole"])) for r in rounds)
            print(f"| {tool} | {lines} | {s:.2f} | {cpu:.2f} | {bad} (of {procs * lines}) |")
    if args.json:
        Path(args.json).write_text(json.dumps(rounds, indent=1))


if __name__ == "__main__":
    main()
