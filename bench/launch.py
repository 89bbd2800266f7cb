"""Launch latency over ssh: time from `launchkit launch` to every worker running, for 3 and 12
namespace hosts, beside the same processes started one ssh connection at a time.

    sudo python bench/launch.py [--hosts 3 12] [--repeat 3]

Needs root (it builds the hosts with network namespaces, like the test fixtures; see
docs/testing.md). Prints a Markdown table; ratios matter, not absolute times (shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.cluster.netns import HostGroup  # noqa: E402

UP = "import time; print('UP', time.time(), flush=True); time.sleep(2)"


def launchkit_once(group: HostGroup, hostfile: Path, home: str) -> float:
    n = len(group)
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
        "-n",
        str(n),
        "-s",
        "0",
        "python3",
        "-c",
        UP,
    ]
    env = {**os.environ, "LAUNCHKIT_HOME": home}
    t0 = time.time()
    res = subprocess.run(argv, capture_output=True, text=True, cwd="/", env=env, timeout=120)
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-2000:])
    ups = [
        float(line.split()[3])
        for line in res.stdout.splitlines()
        if line.startswith("[worker") and " UP " in line
    ]
    if len(ups) != n:
        raise RuntimeError(f"expected {n} workers up, got {len(ups)}")
    return max(ups) - t0


def sequential_once(group: HostGroup) -> float:
    """launch.py's way without its threads: one `ssh host cmd` after another, each waited for
    until its process runs."""
    t0 = time.time()
    procs, last = [], t0
    for h in group:
        p = subprocess.Popen(
            ["ssh", *group.ssh_options(), f"root@{h.address}", f'python3 -c "{UP}"'],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert p.stdout is not None
        line = p.stdout.readline()
        last = float(line.split()[1])
        procs.append(p)
    for p in procs:
        p.wait(timeout=30)
    return last - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, nargs="+", default=[3, 12])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="also write the rows as JSON here")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as home:
        for n in args.hosts:
            group = HostGroup.create(n)
            try:
                hostfile = group.write_hostfile(Path(home) / f"hosts{n}")
                launchkit_once(group, hostfile, home)  # warm-up: host keys recorded, page cache
                lk = statistics.median(launchkit_once(group, hostfile, home) for _ in range(args.repeat))
                seq = statistics.median(sequential_once(group) for _ in range(args.repeat))
                rows.append((n, lk, seq))
            finally:
                group.close()
    base = rows[0][1]
    print(
        "| hosts | launchkit: all workers running (s) | one ssh at a time (s) | launchkit vs sequential | launchkit vs first row |"
    )
    print("|---|---|---|---|---|")
    for n, lk, seq in rows:
        print(f"| {n} | {lk:.2f} | {seq:.2f} | {lk / seq:.2f}x | {lk / base:.2f}x |")
    if args.json:
        Path(args.json).write_text(
            json.dumps([{"hosts": n, "launchkit_s": lk, "sequential_s": seq} for n, lk, seq in rows])
        )


if __name__ == "__main__":
    main()
