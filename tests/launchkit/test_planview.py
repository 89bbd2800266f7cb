"""``--dry-run``'s text (``cli/planview.py``): a summary first; a large plan listed in part (the
first and last processes of each host, of the first and last hosts, a count where some are left
out), quickly; ``--json`` keeps every process."""

from __future__ import annotations

import json
import time
from typing import Any

from launchkit.cli.planview import listed, summary
from tests.launchkit.procs import run


def tasks(per_host: dict[str, int], servers: int = 0) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "scheduler", "rank": 0, "host": next(iter(per_host))}]
    rank = 0
    for host, n in per_host.items():
        for _ in range(n):
            role = "server" if rank < servers else "worker"
            out.append({"role": role, "rank": rank if role == "server" else rank - servers, "host": host})
            rank += 1
    return out


def names(shown: list[Any]) -> list[str]:
    return [x if isinstance(x, str) else f"{x['role']} {x['rank']}@{x['host']}" for x in shown]


def test_a_small_plan_is_listed_whole() -> None:
    plan = tasks({"a": 3, "b": 3}, servers=2)
    assert listed(plan) == plan
    assert summary(plan) == "7 processes (1 scheduler, 2 servers, 4 workers) on 2 hosts: a (4), b (3)"


def test_a_large_plan_lists_both_ends_of_each_host_and_of_the_hosts() -> None:
    plan = tasks({f"h{i}": 10 for i in range(20)})
    shown = names(listed(plan))
    assert shown[:4] == ["scheduler 0@h0", "worker 0@h0", "worker 1@h0", "... 5 more on h0"]
    assert shown[4:7] == ["worker 7@h0", "worker 8@h0", "worker 9@h0"]
    assert "... 14 more hosts (140 processes)" in shown
    assert shown[-1] == "worker 199@h19" and len(shown) == 6 * 7 + 1
    assert summary(plan) == (
        "201 processes (1 scheduler, 200 workers) on 20 hosts: h0 (11), h1 (10), h2 (10), h3 (10), "
        "h4 (10), h5 (10), ... (14 more)"
    )


def test_a_dry_run_of_100000_processes_is_quick_and_its_summary_comes_first() -> None:
    """Was 3 min 49 s and 300,000 lines, with no summary."""
    t0 = time.monotonic()
    res = run(["launch", "-n", "100000", "-s", "0", "--dry-run", "true"], timeout=120)
    took = time.monotonic() - t0
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[1] == "100000 processes (100000 workers) on 1 host: localhost (100000)"
    assert len(lines) < 60 and "... 99994 more on localhost" in res.stdout
    assert lines[-1].startswith("note: 99994 of the 100000 processes are not listed")
    assert "--json lists every one" in lines[-1]
    assert took < 30, took  # 2.3 s measured on the 2-core development machine
    whole = run(["launch", "-n", "3000", "-s", "0", "--dry-run", "--json", "true"], timeout=120)
    assert len(json.loads(whole.stdout)["tasks"]) == 3000
