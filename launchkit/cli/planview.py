"""``--dry-run``: a plan as data (``--json``) and as text. Pure apart from printing through the Ui."""

from __future__ import annotations

import itertools
import shlex
from collections import Counter
from typing import Any

import dmlc_env
from launchkit import backends
from launchkit.console import Ui
from launchkit.core.spec import Plan
from launchkit.roots import AT_LAUNCH

PORT_PLACEHOLDER = "<chosen at launch>"
ROLES = ("scheduler", "server", "worker")


def plan_to_json(
    plan: Plan,
    backend: backends.Backend,
    port_known: bool,
    *,
    max_restarts: int = 0,
    restart_backoff: float = 0.0,
) -> dict[str, object]:
    def env_of(env: dict[str, str]) -> dict[str, str]:
        shown = dmlc_env.redact(env)
        if not port_known:
            shown[dmlc_env.DMLC_PS_ROOT_PORT] = PORT_PLACEHOLDER
        if shown.get(dmlc_env.MASTER_PORT) == "0":  # picked at launch, on worker 0's host
            shown[dmlc_env.MASTER_PORT] = PORT_PLACEHOLDER
        if shown.get(dmlc_env.MASTER_ADDR) == "":
            shown[dmlc_env.MASTER_ADDR] = "<worker 0's address>"
        return shown

    return {
        "job_id": plan.job_id,
        "job_name": plan.job_name,
        "backend": plan.backend,
        "scheduler": f"{plan.root_uri}:{plan.root_port if port_known else PORT_PLACEHOLDER}",
        "engine_commands": backend.describe_job(plan),
        "max_restarts": max_restarts,
        "notes": backend.notes(plan)
        + _address_notes(plan)
        + _restart_notes(max_restarts, restart_backoff)
        + _elastic_notes(plan),
        "tasks": [
            {
                "role": t.role,
                "rank": t.rank,
                "task_id": t.task_id,
                "host": str(t.host),
                "local_rank": t.local_rank,
                "cwd": t.cwd,
                "argv": list(t.argv),
                "command_line": backend.describe(t),
                "env": env_of(dict(t.env)),
            }
            for t in plan.tasks
        ],
    }


def _restart_notes(max_restarts: int, backoff: float) -> list[str]:
    if not max_restarts:
        return []
    times = "once" if max_restarts == 1 else f"up to {max_restarts} times"
    return [
        f"after a process fails on its own, the whole job starts again {times}, {backoff:g} s after "
        "the failed attempt ended (a new scheduler port, LAUNCHKIT_RESTART_COUNT=1, 2, ...)"
    ]


def _elastic_notes(plan: Plan) -> list[str]:
    if plan.elastic is None:
        return []
    low, high = plan.elastic
    started = len(plan.by_role("worker"))
    return [
        f"elastic ({low}:{high}): {started} workers start; the job goes on while at least {low} remain, "
        f"a failed worker's host cools down before it takes another, and new workers start up to {high} "
        "where the backend can add them (docs/elastic.md)"
    ]


def _address_notes(plan: Plan) -> list[str]:
    if plan.root_uri != AT_LAUNCH:
        return []
    first = next((t.host for t in plan.tasks if t.role != "scheduler"), None)
    return [
        f"the scheduler's address (DMLC_PS_ROOT_URI) is chosen at launch: this machine's address on its "
        f"ssh connection to {first.name if first else 'the first host'}, whose name does not resolve here; "
        "give --scheduler-ip ADDR (or --interface IFACE) to fix it"
    ]


#: a plan of more processes is listed in part (``--json`` lists every one)
FULL = 48
EACH_END = 3  # listed at either end of each host's processes, and of the hosts
HOSTS_SHOWN = 2 * EACH_END


def summary(tasks: list[dict[str, Any]]) -> str:
    """The plan in one line: processes by role, and the hosts."""
    by_role = Counter(t["role"] for t in tasks)
    roles = ", ".join(f"{by_role[r]} {r}{'s' if by_role[r] != 1 else ''}" for r in ROLES if by_role[r])
    hosts = Counter(t["host"] for t in tasks)
    where = ", ".join(f"{h} ({n})" for h, n in itertools.islice(hosts.items(), HOSTS_SHOWN))
    if len(hosts) > HOSTS_SHOWN:
        where += f", ... ({len(hosts) - HOSTS_SHOWN} more)"
    n = len(tasks)
    return f"{n} process{'es' if n != 1 else ''} ({roles}) on {len(hosts)} host{'s' if len(hosts) != 1 else ''}: {where}"


def listed(tasks: list[dict[str, Any]]) -> list[dict[str, Any] | str]:
    """The tasks a text plan lists: all of a small plan; of a large one, the first and last
    ``EACH_END`` hosts, and of each the first and last ``EACH_END`` processes, a line (a str)
    counting what is left out where it is."""
    if len(tasks) <= FULL:
        return list(tasks)
    per_host: dict[str, list[dict[str, Any]]] = {}
    for t in tasks:
        per_host.setdefault(t["host"], []).append(t)
    hosts = list(per_host)
    out: list[dict[str, Any] | str] = []

    def host(name: str) -> None:
        mine = per_host[name]
        if len(mine) <= 2 * EACH_END + 1:
            out.extend(mine)
            return
        out.extend(mine[:EACH_END])
        out.append(f"... {len(mine) - 2 * EACH_END} more on {name}")
        out.extend(mine[-EACH_END:])

    if len(hosts) <= HOSTS_SHOWN + 1:
        for name in hosts:
            host(name)
        return out
    for name in hosts[:EACH_END]:
        host(name)
    middle = hosts[EACH_END:-EACH_END]
    out.append(f"... {len(middle)} more hosts ({sum(len(per_host[h]) for h in middle)} processes)")
    for name in hosts[-EACH_END:]:
        host(name)
    return out


def show_plan(ui: Ui, data: dict[str, object]) -> None:
    """The plan as text: a summary first, then the processes (a large plan's in part), their
    environment and command lines, the engine's commands and the notes."""
    tasks = data["tasks"]
    assert isinstance(tasks, list)
    root = (
        f"scheduler {data['scheduler']}"
        if any(isinstance(t, dict) and t.get("role") == "scheduler" for t in tasks)
        else f"no scheduler process: worker 0 serves the rendezvous at {data['scheduler']}"
    )
    ui.text(f"job {data['job_name']} ({data['job_id']}), launcher {data['backend']}, {root}")
    ui.text(summary(tasks))
    shown = listed(tasks)
    ui.table(
        None,
        ["role", "rank", "task id", "host", "local rank", "cwd"],
        [
            [t, "", "", "", "", ""]
            if isinstance(t, str)
            else [t["role"], t["rank"], t["task_id"], t["host"], t["local_rank"], t["cwd"]]
            for t in shown
        ],
    )
    common = dict(tasks[0]["env"])
    for t in tasks[1:]:
        if common:
            common = {k: v for k, v in common.items() if t["env"].get(k) == v}
    ui.text("environment of every process:")
    for k, v in sorted(common.items()):
        ui.text(f"  {k}={v}")
    for t in shown:
        if isinstance(t, str):
            ui.text(t)
            continue
        own = {k: v for k, v in t["env"].items() if k not in common}
        ui.text(f"{t['role']} {t['rank']}: " + " ".join(f"{k}={v}" for k, v in sorted(own.items())))
        ui.text(f"  $ {shlex.join(t['command_line'])}")
    engine = data.get("engine_commands") or []
    assert isinstance(engine, list)
    if engine:
        ui.text(f"started by {data['backend']} with:")
        for argv in engine:
            ui.text(f"  $ {shlex.join(argv)}")
    for note in data.get("notes") or []:  # type: ignore[attr-defined]
        ui.text(f"note: {note}")
    left_out = len(tasks) - sum(1 for t in shown if not isinstance(t, str))
    if left_out:
        ui.text(
            f"note: {left_out} of the {len(tasks)} processes are not listed (the first and last "
            f"{EACH_END} of each host, of the first and last {EACH_END} hosts, are); --json lists every one"
        )
