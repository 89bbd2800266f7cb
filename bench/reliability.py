"""Fault injection, measured: launchkit + trainer_core beside MXNet 1.9.1's tools/launch.py + ps-lite.

    python -m bench.reliability [--repeat 3] [--cap 60] [--only CASE,...] [--json out.json] [--write]

Each case starts a real dist_sync job (2 workers, 1 server, --launcher local), injects one fault
and measures, from the fault to the launcher's exit: the exit code, the seconds (median over
``--repeat`` runs for launchkit; MXNet's runs once per case, since a hang is a hang), whether the
root cause is named, and what is left 2 s after the launcher has gone (processes of the job, and
/dev/shm segments). A launcher still running ``--cap`` seconds after the fault counts as hung and is
killed then, with everything it started (found by a token in their environment).

The programs do the same on both sides: push and pull a 1000-float array per step, 0.05 s apart,
printing ``step K``. launchkit's is tests/faults/trainprog.py; MXNet's is in reliability_kit.py. Both get the
ps-lite heartbeat knobs (trainer_core: every 0.5 s, 2 s timeout; ps-lite takes whole seconds: 1
and 2); trainer_core also gets PS_START_TIMEOUT=5 (ps-lite has no such bound). MXNet's
``launch.py`` needs ``Thread.isAlive`` restored on Python 3.9+ (it is, before it runs unchanged).

The ssh cases (``ssh-*``: a link down, a host unreachable, SIGKILL during rsync) run on three
network-namespace hosts and need root. ``--write`` puts the table into docs/reliability.md.

Modules: reliability_kit.py (the harness and the two sides), reliability_cases.py (the local
cases), reliability_ssh.py (the ssh cases); this one runs them and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from bench.reliability_cases import CASES
from bench.reliability_kit import DOC, Outcome, Side

SSH_CASES = (
    "ssh-link-down-mid",
    "ssh-host-unreachable",
    "ssh-sigkill-during-rsync",
)  # bench/reliability_ssh.py


def fmt(o: Outcome | None, median_s: float | None = None) -> tuple[str, str, str]:
    """(what happened, seconds, message) for the table."""
    if o is None:
        return "not applicable", "", ""
    secs = f"{median_s if median_s is not None else o.seconds:.2f}"
    if o.code == -9:  # the launcher itself was killed
        left = f"{o.left} process(es) running 2 s later" if o.left else "nothing left after 2 s"
        if not o.gone:
            return (
                f"launcher killed; {left}, some still after {o.seconds:.0f} s",
                f"> {o.seconds:.0f}",
                o.message,
            )
        return f"launcher killed; {left}", secs + " until none left", o.message
    code = "hangs, killed at the cap" if o.code is None else f"exit {o.code}"
    left = f"{o.left} process(es) left" if o.left else "nothing left"
    if o.code is None:
        left += " once the launcher was killed"
    if o.shm:
        left += f", {o.shm} /dev/shm segment(s)"
    return (
        f"{code}; {left}",
        (secs if o.code is not None else f"> {o.seconds:.0f}"),
        o.message.replace("|", "/"),
    )


def write_doc(table: str) -> None:
    """Put ``table`` between the ``<!-- bench:reliability -->`` markers of docs/reliability.md."""
    start, end = "<!-- bench:reliability -->", "<!-- /bench:reliability -->"
    text = DOC.read_text()
    head, _, rest = text.partition(start)
    _, _, tail = rest.partition(end)
    DOC.write_text(f"{head}{start}\n{table}\n{end}{tail}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="launchkit runs per case (median)")
    ap.add_argument(
        "--cap", type=float, default=60.0, help="seconds after the fault before a launcher counts as hung"
    )
    ap.add_argument(
        "--only", default=",".join([*CASES, *SSH_CASES]), help="cases, comma-separated (ssh-*: root)"
    )
    ap.add_argument("--no-mxnet", action="store_true")
    ap.add_argument("--json", help="also write the raw outcomes here")
    ap.add_argument("--write", action="store_true", help="also put the table into docs/reliability.md")
    args = ap.parse_args()
    raw: dict[str, dict[str, list[dict[str, object]]]] = {}
    rows = []
    with tempfile.TemporaryDirectory() as d:
        ours = Side("launchkit", d)
        mx = None if args.no_mxnet else Side("mxnet", d)
        for name in args.only.split(","):
            print(f"[reliability] {name} ...", file=sys.stderr, flush=True)
            if name.startswith("ssh-"):
                from bench import reliability_ssh as remote

                what = remote.CASES[name][0]
                runs = [remote.run_case(name, ours, Path(d), args.cap) for _ in range(args.repeat)]
                theirs = None if mx is None else remote.run_case(name, mx, Path(d), args.cap)
            else:
                what, how, comparable = CASES[name]
                runs = [how(ours, args.cap) for _ in range(args.repeat)]
                theirs = how(mx, args.cap) if mx is not None and comparable else None
            raw[name] = {"launchkit": [asdict(r) for r in runs], "mxnet": [asdict(theirs)] if theirs else []}
            median = statistics.median(r.seconds for r in runs)
            rows.append((what, fmt(runs[0], median), fmt(theirs)))
    table = [
        f"_{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores; launchkit: median of {args.repeat} runs; "
        f"MXNet 1.9.1 launch.py: one run, capped at {args.cap:g} s after the fault_",
        "",
        "| case | launchkit + trainer_core | s | its message | MXNet launch.py + ps-lite | s | its message |",
        "|---|---|---|---|---|---|---|",
    ]
    for what, o, t in rows:
        table.append(
            f"| {what} | {o[0]} | {o[1]} | `{o[2]}` | {t[0]} | {t[1]} | {'`' + t[2] + '`' if t[2] else ''} |"
        )
    print("\n".join(table))
    if args.write:
        write_doc("\n".join(table))
    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=1))


if __name__ == "__main__":
    main()
