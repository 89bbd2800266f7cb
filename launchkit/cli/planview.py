"""``--dry-run``: a plan as data (``--json``) and as text. Pure apart from printing through the Ui."""

from __future__ import annotations

import shlex

import dmlc_env
from launchkit import backends
from launchkit.console import Ui
from launchkit.core.spec import Plan
from launchkit.roots import AT_LAUNCH

PORT_PLACEHOLDER = "<chosen at launch>"


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
        "notes": backend.notes(plan) + _address_notes(plan) + _restart_notes(max_restarts, restart_backoff),
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


def _address_notes(plan: Plan) -> list[str]:
    if plan.root_uri != AT_LAUNCH:
        return []
    first = next((t.host for t in plan.tasks if t.role != "scheduler"), None)
    return [
        f"the scheduler's address (DMLC_PS_ROOT_URI) is chosen at launch: this machine's address on its "
        f"ssh connection to {first.name if first else 'the first host'}, whose name does not resolve here; "
        "give --scheduler-ip ADDR (or --interface IFACE) to fix it"
    ]


def show_plan(ui: Ui, data: dict[str, object]) -> None:
    tasks = data["tasks"]
    assert isinstance(tasks, list)
    root = (
        f"scheduler {data['scheduler']}"
        if any(isinstance(t, dict) and t.get("role") == "scheduler" for t in tasks)
        else f"no scheduler process: worker 0 serves the rendezvous at {data['scheduler']}"
    )
    ui.text(f"job {data['job_name']} ({data['job_id']}), launcher {data['backend']}, {root}")
    ui.table(
        None,
        ["role", "rank", "task id", "host", "local rank", "cwd"],
        [[t["role"], t["rank"], t["task_id"], t["host"], t["local_rank"], t["cwd"]] for t in tasks],
    )
    common = dict(tasks[0]["env"])
    for t in tasks[1:]:
        common = {k: v for k, v in common.items() if t["env"].get(k) == v}
    ui.text("environment of every process:")
    for k, v in sorted(common.items()):
        ui.text(f"  {k}={v}")
    for t in tasks:
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
