"""``--launcher yarn``: the job as a YARN Service, through the ResourceManager's REST API.

No Java on the client. The launcher POSTs a service spec to ``/app/v1/services`` (Hadoop 3.2+):
one component per role (``scheduler`` x1, ``server`` xS, ``worker`` xW), every container running
``PYTHON -m launchkit.hostside.shim -- COMMAND...`` with restart policy NEVER. It then polls
``GET /app/v1/services/NAME`` and turns the containers' states into the shim's framed start and
end marks, so the supervisor sees one process per task as with every engine. Containers' output
is not streamed by the Service API (YARN keeps it: ``yarn logs -applicationId``). Ctrl-C,
``launchkit kill`` and a failure stop the service (PUT state STOPPED, then DELETE).

This module is the backend (options, the fail-fast check, the dry run); ``yarnspec`` builds the
service spec (pure), ``yarnrest`` talks to the ResourceManager, ``yarnrun`` follows the service.

What YARN does to a spec, from Hadoop's source (docs/backends.md, section yarn, cites it): the
service AM replaces ``${TOKEN}``s (``${COMPONENT_ID}``, ``${USER}``, ``${DOMAIN}``, and every
variable's own name) in ``configuration.env`` values and in ``launch_command``; the NodeManager
then replaces ``<LOG_DIR>``, ``<CPS>``, ``{{`` and ``}}`` and writes ``export NAME="VALUE"`` and
``exec /bin/bash -c "COMMAND 1>LOG/stdout.txt 2>LOG/stderr.txt"`` into the container's launch
script, without escaping. ``script_value`` and ``launch_command`` encode values so that they come
out of all three layers unchanged.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from launchkit.backends.engine import EngineBackend, EngineRun
from launchkit.backends.engineflags import NODE_PYTHON, QUEUE, ROLE_RESOURCES, per_role
from launchkit.backends.yarnrest import RmClient, check_rm
from launchkit.backends.yarnrun import YarnRun
from launchkit.backends.yarnspec import (
    DEFAULT_MEMORY_MB,
    DEFAULT_PORT,
    YarnOptions,
    lifetime_for,
    memory_mb,
    parse_file,
    redacted,
    scheduler_host,
    service_name,
    service_spec,
)
from launchkit.core.capabilities import Capabilities
from launchkit.core.flags import EngineFlag, fill
from launchkit.core.spec import Host, LaunchSpec, Plan, Task
from launchkit.errors import UsageError

#: the flags of ``launchkit launch`` that fill ``YarnOptions`` (with ``ROLE_RESOURCES``)
FLAGS = (
    QUEUE,
    EngineFlag("--yarn-rm", "The ResourceManager's URL.", fills="rm_url"),
    EngineFlag("--yarn-user", "user.name (simple auth).", fills="user"),
    EngineFlag("--yarn-domain", "The Registry DNS domain.", fills="domain"),
    EngineFlag(
        "--yarn-file",
        "SRC[#NAME] on HDFS, shipped to every container (repeatable).",
        multiple=True,
        fills="files",
    ),
)


# -- the backend -------------------------------------------------------------------------------
class YarnBackend(EngineBackend):
    name = "yarn"
    engine_label = "yarn"
    capabilities = Capabilities(
        hosts="engine",
        hostfile_ignored="YARN places the containers",
        root_in_worker0=False,  # a scheduler component runs even with -s 0
        options=frozenset({"yarn", "node_python", "console"}),
        flags=(*FLAGS, *ROLE_RESOURCES, NODE_PYTHON),
    )

    @classmethod
    def flag_options(cls, flags: Mapping[str, Any], spec: LaunchSpec) -> dict[str, Any]:
        yarn = YarnOptions(**fill(FLAGS, flags), **per_role(flags))
        return {"yarn": yarn, "node_python": NODE_PYTHON.value(flags)}

    def __init__(
        self,
        *,
        yarn: YarnOptions | None = None,
        node_python: str | None = None,
        console: object = None,
    ) -> None:
        super().__init__(console)
        base = yarn or YarnOptions()
        self.opts = replace(base, python=node_python or base.python)
        self.check_options(self.opts)
        self.client = RmClient(self.opts.base_url, self.opts.user_name)
        self.time_limit: float | None = None
        self.grace = 5.0
        self.gpus_per_worker: int | None = None
        self.yarn_run: YarnRun | None = None
        self.rm_version = ""

    @staticmethod
    def check_options(opts: YarnOptions) -> None:
        url = urllib.parse.urlsplit(opts.base_url)
        if url.scheme not in ("http", "https") or not url.netloc:
            raise UsageError(f"--yarn-rm {opts.base_url!r}: expected http://HOST:PORT of the ResourceManager")
        for flag, cpus in (
            ("--cpus-per-server", opts.cpus_per_server),
            ("--cpus-per-worker", opts.cpus_per_worker),
        ):
            if cpus is not None and cpus < 1:
                raise UsageError(f"{flag} must be at least 1, got {cpus}")
        memory_mb(opts.mem_per_server, DEFAULT_MEMORY_MB, "--mem-per-server")
        memory_mb(opts.mem_per_worker, DEFAULT_MEMORY_MB, "--mem-per-worker")
        names = [parse_file(f).dest for f in opts.files]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise UsageError(f"--yarn-file: two files named {sorted(dup)[0]!r} in the container")
        if opts.domain is not None and not re.match(
            r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$", opts.domain
        ):
            raise UsageError(f"--yarn-domain {opts.domain!r}: expected a DNS domain")

    def _learn(self, spec: LaunchSpec) -> None:
        self.time_limit = spec.time_limit
        self.grace = spec.grace_period
        self.gpus_per_worker = spec.gpus_per_worker

    # -- Backend hooks --------------------------------------------------------------------------
    def connect(self, spec: LaunchSpec) -> str | None:
        """Fail fast, before anything is planned or recorded: is the RM there, with its Service
        API on (``yarn.webapp.api-service.enable``), and does it let us in?"""
        self._learn(spec)
        self.rm_version = check_rm(self.client)
        return None

    def finds_scheduler_address(self) -> bool:
        return True  # the scheduler's container is placed by YARN: its name, a fixed port

    def scheduler_summary(self, root_uri: str, port: int) -> str:
        if self.plan is None:
            return "scheduler in its own container"
        name = service_name(self.plan.job_id)
        return f"scheduler {scheduler_host(name, self.opts.domain)}:{port or DEFAULT_PORT} (its container)"

    def node_hosts(self, spec: LaunchSpec) -> dict[Host, str] | None:
        self._learn(spec)
        return dict.fromkeys(spec.hosts, "")  # each task's shim finds its node's address

    def engine_runs(self, task: Task) -> bool:
        return True  # the scheduler is a container too

    def node_unknown(self, task: Task) -> bool:
        return True  # YARN places every container; the start mark names its node

    def spec_for(self, plan: Plan) -> dict[str, Any]:
        return service_spec(
            plan,
            self.opts,
            lifetime=lifetime_for(self.time_limit, self.grace),
            gpus_per_worker=self.gpus_per_worker,
        )

    def describe(self, task: Task) -> list[str]:
        return [self.opts.python, "-m", "launchkit.hostside.shim", "--", *task.argv]

    def describe_job(self, plan: Plan) -> list[list[str]]:
        url = self.client.service_url()
        return [
            [
                "curl",
                "-X",
                "POST",
                "-H",
                "Content-Type: application/json",
                "--data-binary",
                "@SERVICE.json",
                url,
            ]
        ]

    def notes(self, plan: Plan) -> list[str]:
        spec = self.spec_for(plan)
        host = scheduler_host(spec["name"], self.opts.domain)
        port = plan.root_port or DEFAULT_PORT
        return [
            f"submitted as the YARN service {spec['name']} through the ResourceManager's REST API "
            "(the launcher uses urllib; the curl line is the equivalent); SERVICE.json is below",
            f"scheduler: {host}:{port} (the scheduler container's Registry DNS name; YARN fills in "
            "${USER} and ${DOMAIN})",
            "the job's variables, secret included, travel in the service spec (YARN has no "
            "pass-by-name): YARN stores it and shows it to whoever may view the service",
            "containers' output is not streamed: yarn logs -applicationId APPLICATION_ID",
            "SERVICE.json (secret hidden): " + json.dumps(redacted(spec), separators=(",", ":")),
        ]

    def record_info(self) -> dict[str, Any] | None:
        if self.plan is None:
            return None
        return {"engine": "yarn", "service": service_name(self.plan.job_id), "rm_url": self.opts.base_url}

    def make_run(self, plan: Plan) -> EngineRun:
        self.yarn_run = YarnRun(self.client, self.spec_for(plan), plan)
        self.yarn_run.rm_version = self.rm_version
        return self.yarn_run

    def engine_end_message(self, code: int) -> str:
        run = self.yarn_run
        if run is None:
            return super().engine_end_message(code)
        how = run.final_state or f"exit {code}"
        return (
            f"the YARN service {run.name} ended ({how}) before this container's end was seen; "
            f"its output: {run.logs_hint()}"
        )
