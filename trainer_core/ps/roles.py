"""Running the scheduler or server role in this process (``DMLC_ROLE``), as ``import mxnet`` does."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import NoReturn

from trainer_core.config import TRAINER_CORE_AUTOSTART, NodeConfig
from trainer_core.errors import KVError
from trainer_core.log import get_logger


def run_role(role: str, environ: Mapping[str, str] | None = None) -> int:
    """Run ``role`` (scheduler or server) until the job ends; returns the exit code."""
    from trainer_core.ps.scheduler import Scheduler
    from trainer_core.ps.server import Server

    cfg = NodeConfig.from_environ(environ, role=role)
    if role == "scheduler":
        return Scheduler(cfg).run()
    return Server(cfg).run()


def run_role_and_exit(role: str, environ: Mapping[str, str] | None = None) -> NoReturn:
    """Run ``role`` and end the process with its exit code (errors are logged, exit code 1)."""
    try:
        code = run_role(role, environ)
    except KVError as exc:
        get_logger(0).error("trainer_core %s: %s", role, exc)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def autostart() -> None:
    """Called on ``import trainer_core``: run the scheduler/server role when ``DMLC_ROLE`` asks for it."""
    role = os.environ.get("DMLC_ROLE")
    if role in ("scheduler", "server") and os.environ.get(TRAINER_CORE_AUTOSTART, "1") != "0":
        run_role_and_exit(role)
