"""Test tiers: what each test needs, found from its folder, its fixtures and its code.

    unit     no process: the test and its fixtures start none (checked while it runs: ``guard``)
    proc     local processes (a child python, the launchkit CLI, a stand-in engine, g++, tmux)
    cluster  sshd, namespace hosts or an engine (tests/cluster, or a fixture of tests/cluster)
    compat   MXNet 1.9.1 in its own venv (tests/compat, or the ``mxnet_python`` fixture)
    gpu      a CUDA device through cupy or torch (skipped where none is usable)

``tier(item)`` picks one: a tier mark written on the test (or its module, or a ``pytest.param``)
wins; then the folder; then ``gpu``, then the fixtures (compat before cluster), then ``proc``,
else ``unit``. ``gpu`` and ``proc`` come from a scan of the code the test and its fixtures reach
inside ``tests`` (module-level helpers, classes, other test modules' functions): a process start
(``subprocess``, ``multiprocessing``, ``pty``, ``os.fork``, ``os.posix_spawn``, ``os.system``,
``os.exec*``), and ``tests.trainer_core.gpu``'s helpers or an import of cupy.
Code of launchkit and trainer_core is not scanned: a test whose process starts there says so
with ``@pytest.mark.proc``, and ``guard`` makes a test tiered unit fail when it starts one
anyway. tests/conftest.py takes the hooks and fixtures from here; docs/testing.md.
"""

from __future__ import annotations

import inspect
import multiprocessing.util
import os
import subprocess
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

TIERS = ("unit", "proc", "cluster", "compat", "gpu")
DESCRIPTIONS = {
    "unit": "starts no process",
    "proc": "starts local processes, needs no engine, sshd or MXNet",
    "cluster": "needs sshd, namespace hosts or an engine (Slurm, Grid Engine, MPI)",
    "compat": "needs MXNet 1.9.1 (its own venv)",
    "gpu": "needs a CUDA device (skipped without one)",
}
ROOT = Path(__file__).resolve().parent
FOLDERS = {"cluster": "cluster", "compat": "compat"}
CLUSTER_FIXTURES = frozenset(
    {
        "sshd_loopback",
        "netns_session",
        "netns_hosts",
        "slurm_local",
        "slurm_netns",
        "sge_local",
        "node_python",
        "host_python",
    }
)
COMPAT_FIXTURES = frozenset({"mxnet_python"})
GPU_HELPERS = ("gpu", "torch_cuda")  # tests.trainer_core.gpu
# the tiers whose tests share the machine's engines, sshd's session fixture, the namespace hosts'
# subnet and lock, and the MXNet venv: under xdist they stay in one worker (docs/testing.md)
SHARED = ("cluster", "compat")
SHARED_GROUP = "engines"
PROC_MODULES = ("subprocess", "multiprocessing", "pty", "asyncio.subprocess")
IMPORTED = frozenset({"subprocess", "multiprocessing", "pty"})  # `import x` names x in co_names
OS_STARTS = frozenset(
    {"fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "popen", "spawnv", "spawnvp", "spawnl"}
    | {"execv", "execve", "execvp", "execvpe", "execl", "execlp"}
)


def tier(item: pytest.Item) -> str:
    written = [m.name for m in item.iter_markers() if m.name in TIERS]
    if written:
        return max(written, key=TIERS.index)
    path = Path(str(item.path)).resolve()
    parts = path.relative_to(ROOT).parts if path.is_relative_to(ROOT) else ()
    if parts and parts[0] in FOLDERS:
        return FOLDERS[parts[0]]
    fixtures = set(getattr(item, "fixturenames", ()))
    found = reaches(item)
    if "gpu" in found:
        return "gpu"
    if fixtures & COMPAT_FIXTURES:
        return "compat"
    if fixtures & CLUSTER_FIXTURES:
        return "cluster"
    return "proc" if "proc" in found else "unit"


def reaches(item: pytest.Item) -> set[str]:
    """``{'proc', 'gpu'}``, or part of it: what the test's code and its fixtures' code reach."""
    roots: list[Any] = [getattr(item, "obj", None)]
    info = getattr(item, "_fixtureinfo", None)
    for defs in getattr(info, "name2fixturedefs", {}).values():
        roots.extend(d.func for d in defs)
    found: set[str] = set()
    for root in roots:
        found |= _reaches(root)
    return found


#: what each function scanned reaches, keyed by the function itself (it hashes by identity, and
#: the key keeps it alive: an ``id`` of a function a pytester run has freed came back for another)
_seen: dict[Any, set[str]] = {}


def _reaches(obj: Any) -> set[str]:
    func = _function(obj)
    if func is None:
        return set()
    if func in _seen:
        return _seen[func]
    _seen[func] = found = set()  # a cycle of helpers ends here
    names, consts = _names(func.__code__)
    scope = func.__globals__
    if "importorskip" in names and "cupy" in consts:
        found.add("gpu")
    if (scope.get("os") is os and names & OS_STARTS) or names & IMPORTED:
        found.add("proc")  # os.fork(), or `import subprocess` inside the function
    for name in names:
        value = scope.get(name)
        if value is None:
            continue
        if _is_proc_starter(value):
            found.add("proc")
        elif _is_gpu_helper(value):
            found.add("gpu")
        elif isinstance(value, types.ModuleType):
            if _ours(value):
                for attr in names:
                    found |= _reaches_object(getattr(value, attr, None))
        else:
            found |= _reaches_object(value)
    return found


def _reaches_object(value: Any) -> set[str]:
    if _is_gpu_helper(value):
        return {"gpu"}
    if inspect.isclass(value) and _ours(value):
        found: set[str] = set()
        for member in vars(value).values():
            found |= _reaches(getattr(member, "__func__", member))
        return found
    if _function(value) is not None and _ours(value):
        return _reaches(value)
    return set()


def _function(obj: Any) -> types.FunctionType | None:
    obj = getattr(obj, "__func__", obj)
    inner = getattr(getattr(obj, "hypothesis", None), "inner_test", None)
    obj = inspect.unwrap(inner or obj) if callable(inner or obj) else obj
    return obj if isinstance(obj, types.FunctionType) else None


def _names(code: types.CodeType) -> tuple[set[str], set[str]]:
    names, consts = set(code.co_names), set()
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            inner_names, inner_consts = _names(const)
            names |= inner_names
            consts |= inner_consts
        elif isinstance(const, str):
            consts.add(const)
    return names, consts


def _ours(obj: Any) -> bool:
    name = obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", None) or ""
    return name == "tests" or name.startswith("tests.") or name == "conftest"


def _is_proc_starter(value: Any) -> bool:
    name = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
    if not isinstance(name, str):
        return False
    return any(name == m or name.startswith(m + ".") for m in PROC_MODULES)


def _is_gpu_helper(value: Any) -> bool:
    return getattr(value, "__module__", None) == "tests.trainer_core.gpu" and (
        getattr(value, "__name__", None) in GPU_HELPERS
    )


# -- the hooks (tests/conftest.py imports them) --------------------------------------------------


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        name = tier(item)
        item.add_marker(name)
        if name in SHARED:  # under pytest-xdist's --dist loadgroup, one worker runs them all
            item.add_marker(pytest.mark.xdist_group(SHARED_GROUP))


def pytest_report_collectionfinish(items: list[pytest.Item]) -> str:
    return "tiers: " + ", ".join(f"{name} {n}" for name, n in counts(items).items())


@pytest.fixture(autouse=True)
def tier_check(request: pytest.FixtureRequest) -> None:
    """A test tiered unit runs with ``guard``: starting a process fails it."""
    if request.node.get_closest_marker("unit") is not None:
        request.getfixturevalue("guard")


# -- the check: a test tiered unit that starts a process fails ------------------------------------


class StartedAProcess(RuntimeError):
    """Raised where a test tiered ``unit`` starts a process."""


@pytest.fixture
def guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """While a test tiered unit runs (its function-scoped fixtures included), every way to start a
    process raises ``StartedAProcess``, and the test fails at teardown even where the code under
    test caught that (or a thread of its own met it)."""
    started: list[str] = []

    def refuse(what: str) -> Callable[..., Any]:
        def refused(*args: Any, **kwargs: Any) -> Any:
            started.append(f"{what}({_short(args)})")
            raise StartedAProcess(f"a test tiered unit started a process: {started[-1]}")

        return refused

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse("subprocess.Popen"))
    for name in sorted(OS_STARTS):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refuse(f"os.{name}"))
    monkeypatch.setattr(multiprocessing.util, "spawnv_passfds", refuse("multiprocessing spawn"))
    yield
    if started:
        pytest.fail(
            f"{request.node.nodeid} is tiered unit (it starts no process, by tests/tiers.py) but "
            f"started {len(started)}: {', '.join(started[:3])}; mark it @pytest.mark.proc "
            "(or cluster, compat, gpu): docs/testing.md",
            pytrace=False,
        )


def _short(args: tuple[Any, ...]) -> str:
    text = repr(args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else args[:1])
    return text if len(text) < 120 else text[:117] + "..."


def counts(items: list[pytest.Item]) -> dict[str, int]:
    out = dict.fromkeys(TIERS, 0)
    for item in items:
        for name in TIERS:
            if item.get_closest_marker(name) is not None:
                out[name] += 1
    return out
