"""The one registry of backends and what each declares (``Capabilities``), in-process: the
declarations match the constructors, an option a backend does not declare is an error (never
dropped), a backend the launcher has never heard of works from its own module and one registry
line, and the dry run's root address comes from the same cases as the launch's (``Roots``).
Reading every backend's declarations (what every launch does) loads no heavy dependency: that is
checked in a fresh Python, the way a user's command starts."""

from __future__ import annotations

import inspect
import subprocess
import sys
from collections.abc import Iterator

import pytest

from launchkit import backends
from launchkit.backends.base import Backend
from launchkit.backends.mpi import MpiBackend
from launchkit.cli import backendflags
from launchkit.cli.launchspec import build_spec
from launchkit.console import Ui
from launchkit.core.capabilities import Capabilities
from launchkit.core.plan import has_scheduler, make_plan
from launchkit.core.spec import LaunchSpec, Task
from launchkit.errors import UsageError
from launchkit.roots import ITS_NODE, WORKER0_ADDRESS, Roots, root_case

MPIRUN = next(f for f in MpiBackend.capabilities.flags if f.name == "mpirun")


class NewBackend(Backend):
    """A backend the launcher knows nothing of: its module declares what it can do."""

    name = "new"
    capabilities = Capabilities(
        hosts="here",
        hostfile_ignored="it runs here",
        here=True,
        restarts=True,
        root_in_worker0=False,
        options=frozenset({"mpirun"}),
        flags=(MPIRUN,),  # mpi's flag, which it takes too
    )

    def __init__(self, mpirun: str = "mpirun") -> None:
        self.mpirun = mpirun

    def start(self, task: Task) -> object:  # type: ignore[override]
        raise NotImplementedError


@pytest.fixture
def new_backend() -> Iterator[str]:
    backends.REGISTRY["new"] = f"{__name__}:NewBackend"
    try:
        yield "new"
    finally:
        del backends.REGISTRY["new"]


@pytest.mark.parametrize("name", backends.names())
def test_every_backend_declares_the_options_its_constructor_takes(name: str) -> None:
    cls = backends.backend_class(name)
    assert cls.capabilities is not Backend.capabilities, f"{name} declares no capabilities"
    params = {
        p.name
        for p in inspect.signature(cls).parameters.values()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }
    assert cls.capabilities.options == params, name


def test_an_option_a_backend_does_not_declare_is_an_error_not_dropped() -> None:
    with pytest.raises(TypeError, match="backend local takes no option heartbeat_timeout"):
        backends.get_backend("local", heartbeat_timeout=3.0)
    assert backends.get_backend("ssh", heartbeat_timeout=3.0).watchdog_timeout() == 3.0


def test_the_launchers_questions_follow_the_declarations() -> None:
    caps = {name: backends.capabilities(name) for name in backends.names()}
    assert [n for n, c in caps.items() if c.restarts] == ["local", "ssh"]
    assert [n for n, c in caps.items() if c.detaches] == ["sge", "slurm"]
    assert [n for n, c in caps.items() if not c.root_in_worker0] == ["yarn"]
    assert [n for n, c in caps.items() if c.here] == ["local"]
    flags = {f.name: f for f in backends.engine_flags()}
    assert backendflags.takers(flags["queue"]) == ["sge", "yarn"]
    assert backendflags.takers(flags["identity"]) == ["ssh", "mpi"]
    assert backendflags.takers(flags["node_python"]) == ["mpi", "sge", "slurm", "yarn"]


def test_a_new_backend_is_its_module_and_one_registry_line(new_backend: str) -> None:
    spec = build_spec(
        num_workers=2,
        num_servers=0,
        hostfile=None,
        launcher=new_backend,
        sync_dst_dir=None,
        env=[],
        env_server=[],
        env_worker=[],
        log_dir=None,
        job_name=None,
        gpus_per_worker=None,
        scheduler_ip=None,
        scheduler_port=None,
        interface=None,
        grace_period=1.0,
        command=["true"],
        max_restarts=2,
        ui=Ui(),
    )
    assert spec.backend == "new" and spec.max_restarts == 2  # it declares restarts
    backendflags.refuse_unused("new", ["mpirun"])  # the option it declares
    with pytest.raises(
        UsageError, match="--partition does not apply to --launcher new; it is for --launcher slurm"
    ):
        backendflags.refuse_unused("new", ["partition"])
    backend = backends.get_backend("new", mpirun="x")
    caps = backend.capabilities
    assert has_scheduler(spec, caps)  # -s 0, but it does not let worker 0 serve the root
    plan = make_plan(spec, caps=caps, job_id="j", secret="s", root_uri="127.0.0.1", root_port=1)
    assert [t.role for t in plan.tasks] == ["scheduler", "worker", "worker"]
    assert {t.cwd for t in plan.tasks} == {spec.cwd}  # its processes run here
    assert Roots.dry_run_root(spec, backend) == "127.0.0.1"


def spec(backend: str, servers: int, **kw: object) -> LaunchSpec:
    return LaunchSpec(num_workers=2, num_servers=servers, command=("true",), backend=backend, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("backend", "servers", "case", "dry"),
    [
        ("local", 1, "scheduler", "127.0.0.1"),
        ("local", 0, "worker 0 here", "127.0.0.1"),
        ("mpi", 0, "worker 0", WORKER0_ADDRESS),
        ("sge", 1, "scheduler", ITS_NODE),
        ("sge", 0, "worker 0", WORKER0_ADDRESS),
        ("yarn", 0, "scheduler", ITS_NODE),
    ],
)
def test_the_dry_run_root_comes_from_the_launchs_cases(
    backend: str, servers: int, case: str, dry: str
) -> None:
    """One place for the cases: ``Roots.choose`` picks the root of a launch by ``root_case``, and
    ``Roots.dry_run_root`` says the same root's address without contacting anything."""
    s = spec(backend, servers)
    b = backends.get_backend(backend)
    assert root_case(s, b.capabilities) == case
    assert Roots.dry_run_root(s, b) == dry
    if backend in ("local", "sge", "mpi"):  # nothing to contact: the launch's own choice
        roots = Roots.choose(s, b, None)
        try:
            launch = roots.root[0] or (WORKER0_ADDRESS if case == "worker 0" else ITS_NODE)
            assert launch == dry
        finally:
            roots.close()
    with_ip = spec(backend, servers, scheduler_ip="10.0.0.7")
    if case == "worker 0":
        assert Roots.dry_run_root(with_ip, b) == "10.0.0.7"


#: what only the ssh backend's run needs (fabric, with paramiko and invoke: about a third of the CPU
#: a short ``launchkit`` command took while every command loaded them)
HEAVY = ("fabric", "paramiko", "invoke")


def loaded_after(code: str) -> list[str]:
    """Which of HEAVY a fresh Python has imported after running ``code``."""
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.split()


def test_the_cli_and_every_backends_declarations_load_no_fabric() -> None:
    code = (
        "import launchkit.cli, launchkit.launching\n"
        "from launchkit import backends\n"
        "backends.engine_flags()\n"
        "[backends.capabilities(name) for name in backends.names()]\n"
    )
    assert loaded_after(code) == []


def test_the_ssh_connection_loads_them() -> None:
    """The probe sees an import of fabric where there is one."""
    assert loaded_after("import launchkit.backends.ssh.connection") == list(HEAVY)
