"""The YARN Service spec of a job (pure): components, resources, the launch command and
environment encoded so that they come out of YARN's substitutions unchanged, and the mapping of
YARN's states to exit codes. What YARN does to a spec, from Hadoop's source: the service AM
replaces ``${TOKEN}``s (``${COMPONENT_ID}``, ``${USER}``, ``${DOMAIN}``, and every variable's own
name) in ``configuration.env`` values and in ``launch_command``; the NodeManager then replaces
``<LOG_DIR>``, ``<CPS>``, ``{{`` and ``}}`` and writes ``export NAME="VALUE"`` and
``exec /bin/bash -c "COMMAND 1>LOG/stdout.txt 2>LOG/stderr.txt"`` into the container's launch
script, without escaping. See docs/backends.md, section yarn.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import math
import os
import re
import sys
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import dmlc_env
from launchkit.backends.engine import engine_env
from launchkit.core.spec import Plan, Task
from launchkit.errors import UsageError

DEFAULT_RM_URL = "http://localhost:8088"
RM_URL_VAR = "YARN_RM_URL"
DEFAULT_PORT = 9091
SERVICES_PATH = "/app/v1/services"
APPS_PATH = "/ws/v1/cluster/apps"
ROLES = ("scheduler", "server", "worker")  # the components, and the shim table's order
DEFAULT_CPUS = 1
DEFAULT_MEMORY_MB = 1024
SERVICE_VERSION = "1.0.0"
OFFSET_VAR = "LAUNCHKIT_SHIM_OFFSET"
RANK_VAR = "COMPONENT_ID"
#: The service AM replaces this token with the container's instance index (0, 1, ...).
RANK_TOKEN = "${COMPONENT_ID}"
POLL = 0.5  # seconds between two GETs for the first FAST_FOR seconds, then SLOW_POLL
FAST_FOR = 30.0
SLOW_POLL = 2.0
HTTP_TIMEOUT = 30.0
RM_LOST_AFTER = 120.0  # seconds without an answer from the RM before the job counts as lost
STOP_WAIT = 60.0  # after asking for a stop, how long to wait for the service to say STOPPED
KILL_WAIT = 10.0  # after a DELETE (the launcher's SIGKILL), how long to wait for it to be gone
LIFETIME_MARGIN = 60  # the service's lifetime: --time-limit + grace + this (a backstop)
LIFETIME_DIAG = "exceeded the lifetime period"  # the RM's diagnostics for a lifetime kill

#: Service states after which nothing runs any more (ServiceState.java; EXPIRED is no state:
#: a service past its lifetime is killed by the RM and then reads STOPPED).
SERVICE_FINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
#: A container's final state -> the process's exit code. The Service API has no exit status:
#: FAILED is any non-zero exit, reported as 1.
CONTAINER_CODES = {"SUCCEEDED": 0, "FAILED": 1, "STOPPED": 143}
#: The RM's finalStatus of the application, for tasks whose own end the launcher did not see.
APP_CODES = {"SUCCEEDED": 0, "FAILED": 1, "KILLED": 143, "ENDED": 143}
CODE_LIFETIME = 124  # as --time-limit
CODE_RM_LOST = 255  # as a lost ssh host


# -- options -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class YarnOptions:
    """What ``--launcher yarn`` is told. ``None`` means the default (see the properties)."""

    rm_url: str | None = None  # --yarn-rm (default $YARN_RM_URL, else http://localhost:8088)
    user: str | None = None  # --yarn-user: the user.name of simple auth (default: $USER)
    queue: str | None = None  # --queue
    domain: str | None = None  # --yarn-domain: Registry DNS domain (default: YARN's ${DOMAIN})
    cpus_per_server: int | None = None
    cpus_per_worker: int | None = None
    mem_per_server: str | None = None  # "4G", "512M", or MB as a number
    mem_per_worker: str | None = None
    files: tuple[str, ...] = ()  # --yarn-file SRC[#NAME], SRC on HDFS (or another cluster FS)
    python: str = sys.executable  # the Python on the nodes (--node-python)

    @property
    def base_url(self) -> str:
        return (self.rm_url or os.environ.get(RM_URL_VAR) or DEFAULT_RM_URL).rstrip("/")

    @property
    def user_name(self) -> str:
        if self.user:
            return self.user
        with contextlib.suppress(Exception):
            return os.environ.get("USER") or getpass.getuser()
        return "launchkit"


@dataclass(frozen=True)
class ShippedFile:
    """One ``configuration.files`` entry: localized by the NodeManager into the container's
    working directory as ``dest`` (an ARCHIVE is unpacked into a directory of that name)."""

    src: str
    dest: str
    type: str  # STATIC or ARCHIVE

    def to_json(self) -> dict[str, str]:
        return {"type": self.type, "src_file": self.src, "dest_file": self.dest}


ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")
_DEST = re.compile(r"^[A-Za-z0-9._+-]+$")
_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(?:i?b)?\s*$", re.IGNORECASE)
_MEMORY_MB = {"": 1.0, "k": 1 / 1024, "m": 1.0, "g": 1024.0, "t": 1024.0**2, "p": 1024.0**3}


def memory_mb(value: str | int | None, default: int, flag: str) -> int:
    """``"4G"`` -> 4096, ``"512M"`` -> 512, ``"2048"`` -> 2048 (a bare number is MB, as in YARN)."""
    if value is None or value == "":
        return default
    m = _MEMORY.match(str(value))
    if not m:
        raise UsageError(f"{flag} {value!r}: expected a size like 4G, 512M or a number of MB")
    mb = math.ceil(float(m.group(1)) * _MEMORY_MB[m.group(2).lower()])
    if mb < 1:
        raise UsageError(f"{flag} {value!r}: must be at least 1 MB")
    return mb


def parse_file(item: str) -> ShippedFile:
    """``--yarn-file SRC[#NAME]``: SRC is a URI the cluster reads (hdfs://, viewfs://, s3a://,
    file:// on a filesystem every node mounts); NAME defaults to SRC's last path element."""
    src, sep, dest = item.rpartition("#") if "#" in item else (item, "", "")
    parts = urllib.parse.urlsplit(src)
    if len(parts.scheme) < 2 or not parts.path.strip("/"):
        raise UsageError(
            f"--yarn-file {item!r}: {src!r} is not a file on a filesystem the cluster reads; YARN "
            "localizes files from HDFS (or another cluster filesystem), it cannot ship a local "
            "file: upload it first (hdfs dfs -put FILE /user/NAME/) and pass hdfs:///user/NAME/FILE"
        )
    name = dest if sep else parts.path.rstrip("/").rsplit("/", 1)[-1]
    if not _DEST.match(name) or name in (".", ".."):
        raise UsageError(
            f"--yarn-file {item!r}: {name!r} cannot be a name in the container's directory "
            "(letters, digits, . _ + - only)"
        )
    kind = "ARCHIVE" if parts.path.lower().endswith(ARCHIVE_SUFFIXES) else "STATIC"
    return ShippedFile(src, name, kind)


def service_name(job_id: str) -> str:
    """A YARN service name for the job: lowercase letters, digits and hyphens, starting with a
    letter, at most 63 characters (ServiceApiUtil's name pattern and the DNS label limit)."""
    body = re.sub(r"[^a-z0-9]+", "-", job_id.lower()).strip("-")
    return f"lk-{body or 'job'}"[:63].rstrip("-")


def scheduler_host(service: str, domain: str | None) -> str:
    """The scheduler container's Registry DNS name. ``${USER}`` (and ``${DOMAIN}`` when no domain
    is given) are filled in by the service AM with its own values, so the name is exactly the
    one Registry DNS publishes."""
    return f"scheduler-0.{service}.${{USER}}.{domain or '${DOMAIN}'}"


def lifetime_for(time_limit: float | None, grace: float) -> int | None:
    """The service's lifetime (seconds): a backstop a minute past the launcher's own limit."""
    if not time_limit:
        return None
    return math.ceil(time_limit + grace) + LIFETIME_MARGIN


# -- what YARN does to values (see the module docstring) ----------------------------------------
def script_value(value: str) -> str:
    """``value`` for ``configuration.env``, so that the line the NodeManager writes,
    ``export NAME="VALUE"``, sets exactly ``value``: ``\\ " ` $`` escaped for the double quotes,
    and an empty ``""`` after ``$ { } <`` so that no ``${TOKEN}``, ``{{``, ``}}``, ``<LOG_DIR>``
    or ``<CPS>`` is left for YARN to replace."""
    out = []
    for ch in value:
        if ch in '\\"`':
            out.append("\\" + ch)
        elif ch == "$":
            out.append('\\$""')
        elif ch in "{}<":
            out.append(ch + '""')
        else:
            out.append(ch)
    return "".join(out)


_SAFE_WORD = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def shell_word(arg: str) -> str:
    """``arg`` as one word for the container's ``bash -c``: single-quoted, with an empty ``''``
    after ``$ { } <`` so that YARN finds nothing to replace."""
    if _SAFE_WORD.match(arg):
        return arg
    out = ["'"]
    for ch in arg:
        if ch == "'":
            out.append("'\"'\"'")
        else:
            out.append(ch)
            if ch in "${}<":
                out.append("''")
    out.append("'")
    return "".join(out)


def launch_command(argv: Sequence[str]) -> str:
    """A component's ``launch_command``: ``argv`` as the one string the NodeManager puts inside
    ``exec /bin/bash -c "..."`` (so escaped once more for those double quotes)."""
    inner = " ".join(shell_word(a) for a in argv)
    return re.sub(r'([\\"`$])', r"\\\1", inner)


# -- the service spec (pure) -------------------------------------------------------------------
def table_order(tasks: Sequence[Task]) -> list[Task]:
    """Shim table order: the scheduler, the servers, the workers (each by rank): row
    ``offset(role) + COMPONENT_ID`` is that component's container."""
    return sorted(tasks, key=lambda t: (ROLES.index(t.role), t.rank))


def role_offsets(tasks: Sequence[Task]) -> dict[str, int]:
    counts = {r: sum(1 for t in tasks if t.role == r) for r in ROLES}
    offsets, at = {}, 0
    for role in ROLES:
        offsets[role] = at
        at += counts[role]
    return offsets


def _resource(cpus: int | None, mem: str | None, flag: str, gpus: int | None = None) -> dict[str, Any]:
    res: dict[str, Any] = {
        "cpus": cpus or DEFAULT_CPUS,
        "memory": str(memory_mb(mem, DEFAULT_MEMORY_MB, flag)),
    }
    if gpus:
        res["additional"] = {"yarn.io/gpu": {"value": gpus, "unit": ""}}
    return res


def service_spec(
    plan: Plan, opts: YarnOptions, *, lifetime: int | None = None, gpus_per_worker: int | None = None
) -> dict[str, Any]:
    """The YARN service for the job (the POST body). Pure.

    Every variable's value is encoded with ``script_value``; two are left for YARN to fill in:
    ``COMPONENT_ID`` (the shim's rank within the role, with ``LAUNCHKIT_SHIM_OFFSET``) and the
    scheduler's address in ``DMLC_PS_ROOT_URI``."""
    name = service_name(plan.job_id)
    tasks = list(plan.tasks)
    if gpus_per_worker:  # YARN binds the GPUs it gives (yarn.io/gpu): its CUDA_VISIBLE_DEVICES stands
        tasks = [
            replace(t, env={k: v for k, v in t.env.items() if k != dmlc_env.CUDA_VISIBLE_DEVICES})
            for t in tasks
        ]
    ordered = table_order(tasks)
    shared = engine_env(plan, ordered)
    env = {k: script_value(v) for k, v in shared.items()}
    env[dmlc_env.DMLC_PS_ROOT_URI] = scheduler_host(name, opts.domain)
    env[dmlc_env.DMLC_PS_ROOT_PORT] = str(plan.root_port or DEFAULT_PORT)
    command = launch_command([opts.python, "-m", "launchkit.hostside.shim", "--", *plan.tasks[0].argv])
    files = [parse_file(f).to_json() for f in opts.files]
    resources = {
        "scheduler": _resource(None, None, "scheduler"),
        "server": _resource(opts.cpus_per_server, opts.mem_per_server, "--mem-per-server"),
        "worker": _resource(opts.cpus_per_worker, opts.mem_per_worker, "--mem-per-worker", gpus_per_worker),
    }
    offsets = role_offsets(ordered)
    components = []
    for role in ROLES:
        count = sum(1 for t in ordered if t.role == role)
        if not count:
            continue
        comp: dict[str, Any] = {
            "name": role,
            "number_of_containers": count,
            "resource": resources[role],
            "launch_command": command,
            "restart_policy": "NEVER",
            "configuration": {"env": {**env, OFFSET_VAR: str(offsets[role]), RANK_VAR: RANK_TOKEN}},
        }
        if role != "scheduler":
            comp["dependencies"] = ["scheduler"]
        if files:
            comp["configuration"]["files"] = files
        components.append(comp)
    spec: dict[str, Any] = {
        "name": name,
        "version": SERVICE_VERSION,
        "description": f"launchkit job {plan.job_id} ({plan.job_name})",
        "components": components,
    }
    if opts.queue:
        spec["queue"] = opts.queue
    if lifetime:
        spec["lifetime"] = lifetime
    return spec


def redacted(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a service spec safe to print: the job secret hidden."""
    out = json.loads(json.dumps(spec))
    for comp in out.get("components", []):
        env = comp.get("configuration", {}).get("env", {})
        for name in dmlc_env.SECRET_VARS & set(env):
            env[name] = dmlc_env.SECRET_PLACEHOLDER
    return out


# -- containers -> tasks, states -> exit codes (pure) ------------------------------------------
def instance_task(instance: str) -> tuple[str, int] | None:
    """``worker-3`` (a component instance name) -> ("worker", 3)."""
    role, _, index = instance.rpartition("-")
    if role not in ROLES or not index.isdigit():
        return None
    return role, int(index)


def container_code(state: str, stopping: bool) -> tuple[int, int] | None:
    """A container's state -> (exit code, stopped flag) once it is final, else None."""
    if state not in CONTAINER_CODES:
        return None
    code = CONTAINER_CODES[state]
    return code, 1 if state == "STOPPED" and stopping else 0


def app_code(final_status: str, diagnostics: str = "") -> int:
    """The RM's finalStatus for an application -> the exit code of tasks not seen ending."""
    if final_status == "KILLED" and LIFETIME_DIAG in diagnostics:
        return CODE_LIFETIME
    return APP_CODES.get(final_status, 1)


def app_id_of(status: Mapping[str, Any]) -> str | None:
    """The application id from a POST answer (``"diagnostics": "Application ID: ..."``)."""
    m = re.search(r"application_\d+_\d+", str(status.get("diagnostics") or ""))
    return m.group(0) if m else None


# -- the REST client (urllib only) -------------------------------------------------------------
