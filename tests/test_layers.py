"""The dependency rules of the three packages, read from their source (no import is executed).

trainer_core: a dependency graph of packages (``TC_DEPS``: what each may import). ``transport``
(protocol-neutral channels) at the bottom, ``metrics`` on it, ``node`` (joining, the book,
liveness, barriers, request tracking) on those; ``ps`` (the parameter server) and ``collective``
side by side on ``node``, never importing each other; ``kv`` on ``ps``; ``train`` on top.
``compression`` and ``optim`` are leaves any layer may use, which themselves use only the base
modules (``errors``, ``log``, ``xp``, ``config``, ``sharedmap``). Inside ``collective``, its parts form a stack of
their own (``COLLECTIVE_DEPS``: primitives, algorithms, the data paths, group, the ``Links``
implementations, job). Neither trainer_core nor ``dmlc_env`` imports
launchkit; ``dmlc_env`` and ``launchkit.hostside`` import only the standard library. Across all
three packages there is no import cycle, and no module is longer than MAX_LINES (a warning past SMELL_LINES).
"""

from __future__ import annotations

import ast
import functools
import sys
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("launchkit", "trainer_core", "dmlc_env")
# a module over SMELL_LINES gets a warning, one over MAX_LINES fails (test_modules_stay_small)
SMELL_LINES = 400
MAX_LINES = 600

# trainer_core's packages and the packages each may import (besides itself, the base and the
# leaves, which any of them may use); the graph is acyclic (``test_the_allowed_graph_is_acyclic``).
TC_DEPS: dict[str, frozenset[str]] = {
    "transport": frozenset(),
    "metrics": frozenset({"transport"}),
    "node": frozenset({"transport", "metrics"}),
    "ps": frozenset({"node", "transport", "metrics"}),
    "collective": frozenset({"node", "transport", "metrics"}),
    "kv": frozenset({"ps", "node", "transport", "metrics"}),
    "train": frozenset({"kv", "ps", "collective", "node", "transport", "metrics"}),
    # trainer_core.torch (the only importer of torch) sits on everything it drives
    "torch": frozenset({"train", "kv", "ps", "collective", "node", "transport", "metrics"}),
}
TC_LEAVES = ("compression", "optim")
TC_BASE = ("errors", "log", "xp", "config", "sharedmap")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            found[module_name(path)] = path
    return found


MODULES = modules()


def imports_of(name: str, path: Path, package_of_modules: bool = True) -> list[tuple[str, int]]:
    """Every module ``name`` imports (absolute names, with the line), at any depth of the file;
    ``package_of_modules=False``: ``from pkg import mod, other`` (modules only) names the modules
    but not ``pkg``, whose ``__init__`` Python runs first but whose names it does not use."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from pkg import module`` imports that module
            named = [
                (f"{base}.{alias.name}", node.lineno)
                for alias in node.names
                if f"{base}.{alias.name}" in MODULES
            ]
            if package_of_modules or len(named) < len(node.names):
                found.append((base, node.lineno))
            found += named
    return found


def internal(target: str) -> str | None:
    """The project module ``target`` names (itself, or the package it is in), or None."""
    while target:
        if target in MODULES:
            return target
        target = target.rpartition(".")[0]
    return None


def edges() -> dict[str, set[tuple[str, int]]]:
    graph: dict[str, set[tuple[str, int]]] = {}
    for name, path in MODULES.items():
        graph[name] = {
            (t, line) for raw, line in imports_of(name, path) if (t := internal(raw)) and t != name
        }
    return graph


class _Graph(Mapping[str, set[tuple[str, int]]]):
    """``edges()``, read on first use: parsing every module is half a second of CPU, which each pytest
    process that collects this file (each xdist worker) paid at import, whether or not it ran
    these tests."""

    @functools.cached_property
    def _edges(self) -> dict[str, set[tuple[str, int]]]:
        return edges()

    def __getitem__(self, name: str) -> set[tuple[str, int]]:
        return self._edges[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._edges)

    def __len__(self) -> int:
        return len(self._edges)


GRAPH = _Graph()


def where(name: str, line: int) -> str:
    return f"{MODULES[name].relative_to(ROOT)}:{line}"


def tc_part(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if parts[0] == "trainer_core" and len(parts) > 1 else None


def allowed_tc(src: str, dst: str) -> bool:
    a, b = tc_part(src), tc_part(dst)
    if dst == "trainer_core" or b is None or a == b:
        return dst != "trainer_core" or src == "trainer_core"
    if b in TC_BASE:
        return True
    if a in TC_BASE:
        return False  # the base uses nothing above it
    if a in TC_LEAVES:
        return False  # leaves use only the base
    if b in TC_LEAVES:
        return True
    if a is None:  # trainer_core/__init__.py: only the role autostart
        return b == "ps"
    if a in TC_DEPS and b in TC_DEPS:
        return b in TC_DEPS[a]
    return False  # a package the graph does not name: add it there first


def test_the_allowed_graph_is_acyclic() -> None:
    """No two packages may import each other, directly or around a loop (ps and collective are
    siblings: neither is below the other)."""
    order: list[str] = []
    while len(order) < len(TC_DEPS):
        ready = [p for p, deps in TC_DEPS.items() if p not in order and deps <= set(order)]
        assert ready, f"TC_DEPS has a cycle among {sorted(set(TC_DEPS) - set(order))}"
        order += sorted(ready)
    assert "collective" not in TC_DEPS["ps"] and "ps" not in TC_DEPS["collective"]


# trainer_core.collective's own stack: each part (a subpackage, or a module at the package's top)
# and the parts it may import besides itself. The primitives (the point-to-point interface, the
# reduction operators, the host's shared-memory segment) at the bottom; the algorithms on them
# alone; the algorithm choice (policy) on the algorithms; the other data paths (compressed/, nccl)
# beside it; Group on all of those; the Links implementations (fabric in one process, sockets/
# between processes) on the primitives only; job, the only importer of sockets/, on top. The
# package's __init__ is the public API over it (never the implementations of Links).
COLLECTIVE_DEPS: dict[str, frozenset[str]] = {
    "primitives": frozenset(),
    "algorithms": frozenset({"primitives"}),
    "policy": frozenset({"algorithms"}),
    "compressed": frozenset({"policy", "algorithms", "primitives"}),
    "nccl": frozenset({"algorithms", "primitives"}),
    "executor": frozenset({"primitives"}),
    "fusion": frozenset(),
    "agreement": frozenset(),
    "batching": frozenset({"agreement"}),
    "exchange": frozenset({"agreement", "primitives"}),
    "timeline": frozenset(),
    "negotiator": frozenset({"agreement", "batching", "exchange", "executor", "primitives", "timeline"}),
    "lane": frozenset({"policy", "primitives"}),
    "speculation": frozenset({"exchange", "agreement", "primitives"}),
    "moves": frozenset({"agreement", "algorithms", "lane", "nccl", "negotiator", "policy", "primitives"}),
    "joining": frozenset({"agreement", "moves", "negotiator", "primitives"}),
    "group": frozenset(
        {
            "compressed",
            "nccl",
            "policy",
            "algorithms",
            "primitives",
            "executor",
            "fusion",
            "agreement",
            "negotiator",
            "exchange",
            "lane",
            "speculation",
            "timeline",
            "moves",
            "joining",
        }
    ),
    "subgroups": frozenset({"group", "primitives", "timeline"}),
    "fabric": frozenset({"primitives"}),
    "sockets": frozenset({"primitives"}),
    "job": frozenset({"group", "sockets", "nccl", "policy", "primitives", "timeline"}),
    "__init__": frozenset(
        {"job", "group", "compressed", "policy", "algorithms", "primitives", "executor", "agreement"}
    ),
}
COLLECTIVE = "trainer_core.collective"
# the parts that use the layers below collective (the node layer, the transport, metrics): the
# rest is written against ``primitives.links.Links`` and knows no process or socket
COLLECTIVE_ON_NODE = frozenset({"sockets", "job"})


def coll_part(name: str) -> str | None:
    """The part of trainer_core.collective that module ``name`` belongs to (None: outside it)."""
    if name == COLLECTIVE:
        return "__init__"
    if not name.startswith(COLLECTIVE + "."):
        return None
    return name.split(".")[2]


def collective_breaks(graph: dict[str, set[tuple[str, int]]]) -> list[str]:
    """Every import inside trainer_core.collective that ``COLLECTIVE_DEPS`` does not allow (a
    part below importing the package's public API included), and every module of a part the table
    does not name; and any use of the layers below collective (node, transport, metrics) outside
    ``COLLECTIVE_ON_NODE``; any import of ``sockets`` by trainer_core outside the package.
    ``graph``: module -> the (module, line) it imports (fabricated ones too)."""

    def at(src: str, line: int) -> str:
        return where(src, line) if src in MODULES else f"{src}:{line}"

    bad = []
    for src, targets in sorted(graph.items()):
        a = coll_part(src)
        if a is None:  # outside the package, only its job module reaches the socket implementation
            bad += [
                f"{at(src, line)}: {src} imports {dst} (only collective.job imports sockets/)"
                for dst, line in sorted(targets)
                if src.startswith("trainer_core") and coll_part(dst) == "sockets"
            ]
            continue
        if a not in COLLECTIVE_DEPS:
            bad.append(f"{at(src, 1)}: {src} is in a part COLLECTIVE_DEPS does not name ({a}): add it there")
            continue
        for dst, line in sorted(targets):
            b = coll_part(dst)
            if b is None and tc_part(dst) in TC_DEPS["collective"] and a not in COLLECTIVE_ON_NODE:
                bad.append(
                    f"{at(src, line)}: {src} ({a}) imports {dst}: only {sorted(COLLECTIVE_ON_NODE)} may"
                )
            if b is None or b == a:
                continue
            if b not in COLLECTIVE_DEPS[a]:
                bad.append(f"{at(src, line)}: {src} ({a}) imports {dst} ({b})")
    return bad


def test_the_collective_stack_is_acyclic() -> None:
    """The parts of trainer_core.collective form a stack: no two import each other, directly or
    around a loop; every part the table names exists; only ``job`` imports ``sockets``."""
    order: list[str] = []
    while len(order) < len(COLLECTIVE_DEPS):
        ready = [p for p, deps in COLLECTIVE_DEPS.items() if p not in order and deps <= set(order)]
        assert ready, f"COLLECTIVE_DEPS has a cycle among {sorted(set(COLLECTIVE_DEPS) - set(order))}"
        order += sorted(ready)
    present = {coll_part(name) for name in MODULES} - {None}
    assert set(COLLECTIVE_DEPS) == present, "COLLECTIVE_DEPS names the parts of trainer_core.collective"
    assert [p for p, deps in COLLECTIVE_DEPS.items() if "sockets" in deps] == ["job"]
    assert COLLECTIVE_DEPS["algorithms"] == {"primitives"}
    primitives = {name.rpartition(".")[2] for name in MODULES if coll_part(name) == "primitives"}
    assert primitives == {"primitives", "links", "reduce", "hostsegment", "futex", "stall"}


def test_collective_layers() -> None:
    graph = {
        name: {(t, line) for raw, line in imports_of(name, path, False) if (t := internal(raw)) and t != name}
        for name, path in MODULES.items()
        if name.startswith("trainer_core")
    }
    bad = collective_breaks(graph)
    assert not bad, (
        "collective layer rule broken (COLLECTIVE_DEPS: primitives -> algorithms -> policy/compressed/nccl "
        "-> group -> job; fabric and sockets on the primitives, only job imports sockets):\n" + "\n".join(bad)
    )


def fake(part: str) -> str:
    """A module name in ``part`` of trainer_core.collective (for a fabricated graph)."""
    return COLLECTIVE if part == "__init__" else f"{COLLECTIVE}.{part}.mod"


@pytest.mark.parametrize("part", sorted(COLLECTIVE_DEPS))
def test_every_collective_rule_catches_its_violation(part: str) -> None:
    """The checker itself, on fabricated graphs: for each part, an import of every part the table
    does not allow it is reported, naming both; one of every part it allows, or of itself, is not;
    one of the node layer, the transport or metrics only outside ``COLLECTIVE_ON_NODE``."""
    for other in sorted(COLLECTIVE_DEPS):
        graph = {fake(part): {(fake(other), 7)}}
        bad = collective_breaks(graph)
        if other == part or other in COLLECTIVE_DEPS[part]:
            assert bad == [], (part, other, bad)
        else:
            assert len(bad) == 1 and fake(part) in bad[0] and fake(other) in bad[0], (part, other, bad)
    for below in ("trainer_core.node.book", "trainer_core.transport.wire", "trainer_core.metrics"):
        bad = collective_breaks({fake(part): {(below, 9)}})
        assert bool(bad) == (part not in COLLECTIVE_ON_NODE), (part, below, bad)


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        # the algorithms use only the links interface, the reduction and the shared memory
        ("trainer_core.collective.algorithms.ring", "trainer_core.collective.group"),
        ("trainer_core.collective.algorithms.tree", "trainer_core.collective.policy"),
        ("trainer_core.collective.algorithms.shmreduce", "trainer_core.collective.sockets.netlinks"),
        # only job imports the socket implementation
        ("trainer_core.collective.group", "trainer_core.collective.sockets.netlinks"),
        ("trainer_core.collective", "trainer_core.collective.sockets.protocol"),
        ("trainer_core.collective.fabric", "trainer_core.collective.sockets.handles"),
        ("trainer_core.torch.backend", "trainer_core.collective.sockets.netlinks"),
        # the primitives import nothing above them
        ("trainer_core.collective.primitives.links", "trainer_core.collective.algorithms.ring"),
        # a part below never imports the public API (a cycle through __init__)
        ("trainer_core.collective.compressed.twostage", "trainer_core.collective"),
        # only sockets/ and job use the node layer and the transport
        ("trainer_core.collective.group", "trainer_core.node.postoffice"),
        ("trainer_core.collective.primitives.hostsegment", "trainer_core.transport.wire"),
        # a module of a part the table does not name
        ("trainer_core.collective.newpart", "trainer_core.collective.primitives.links"),
    ],
)
def test_collective_violations_are_caught(src: str, dst: str) -> None:
    """The rules the issue names, each broken on purpose in a fabricated graph."""
    assert collective_breaks({src: {(dst, 3)}}), f"{src} -> {dst} was not caught"


def test_trainer_core_layers() -> None:
    bad = [
        f"{where(src, line)}: {src} imports {dst}"
        for src, targets in GRAPH.items()
        if src.startswith("trainer_core")
        for dst, line in sorted(targets)
        if dst.startswith("trainer_core") and not allowed_tc(src, dst)
    ]
    assert not bad, (
        "layer rule broken (TC_DEPS: train -> kv -> ps -> node -> metrics -> transport, collective beside ps; "
        "compression/optim are leaves):\n" + "\n".join(bad)
    )


@pytest.mark.parametrize("package", ["trainer_core", "dmlc_env"])
def test_does_not_import_launchkit(package: str) -> None:
    bad = [
        f"{where(src, line)}: {src} imports {dst}"
        for src, targets in GRAPH.items()
        if src.split(".")[0] == package
        for dst, line in sorted(targets)
        if dst.split(".")[0] == "launchkit"
    ]
    assert not bad, "\n".join(bad)


def test_launchkit_does_not_import_trainer_core() -> None:
    bad = [
        f"{where(src, line)}: {src} imports {dst}"
        for src, targets in GRAPH.items()
        if src.startswith("launchkit")
        for dst, line in sorted(targets)
        if dst.startswith("trainer_core")
    ]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("prefix", ["dmlc_env", "launchkit.hostside"])
def test_standard_library_only(prefix: str) -> None:
    """What runs on a bare host, or in any launcher, needs Python and nothing else."""
    bad = []
    for name, path in MODULES.items():
        if name != prefix and not name.startswith(prefix + "."):
            continue
        for raw, line in imports_of(name, path):
            top = raw.split(".")[0]
            if top == "__future__" or top in sys.stdlib_module_names:
                continue
            if top == "dmlc_env":  # the contract, standard library only itself (checked here too)
                continue
            inside = internal(raw)
            if inside is not None and (inside == prefix or inside.startswith(prefix + ".")):
                continue
            bad.append(f"{where(name, line)}: {name} imports {raw}")
    assert not bad, "\n".join(bad)


def test_no_import_cycle() -> None:
    graph = {src: {dst for dst, _ in targets} for src, targets in GRAPH.items()}
    # a package's __init__ re-exporting its own modules is not a cycle of the design
    for src in graph:
        graph[src] = {dst for dst in graph[src] if not src.startswith(dst + ".")}
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_modules_stay_small() -> None:
    """A smell detector with room: a module over SMELL_LINES is worth a look (a warning naming
    it), one over MAX_LINES fails. Modules are cut by responsibility, not to meet a count."""
    sizes = {name: len(path.read_text().splitlines()) for name, path in MODULES.items()}
    long = [f"{name}: {n} lines" for name, n in sorted(sizes.items()) if n > MAX_LINES]
    assert not long, f"modules over {MAX_LINES} lines (each has more than one job?):\n" + "\n".join(long)
    for name, n in sorted(sizes.items()):
        if n > SMELL_LINES:
            warnings.warn(f"{name} has {n} lines (over {SMELL_LINES}): does it have one job?", stacklevel=1)


def lk_part(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_launchkit_layers() -> None:
    """The pure core uses only itself, the errors module and the env contract; nothing but the
    command-line layer (and ``__main__``) imports ``launchkit.cli``."""
    bad = []
    for src, targets in GRAPH.items():
        if not src.startswith("launchkit"):
            continue
        for dst, line in sorted(targets):
            if lk_part(dst) == "cli" and lk_part(src) not in ("cli", "__main__"):
                bad.append(f"{where(src, line)}: {src} imports {dst}")
            if (
                lk_part(src) == "core"
                and dst.startswith("launchkit")
                and lk_part(dst) not in ("core", "errors")
            ):
                bad.append(f"{where(src, line)}: {src} (pure core) imports {dst}")
    assert not bad, "\n".join(bad)


# What launchkit.view (the view's pure parts) may import of launchkit: itself, the pure core, the
# errors, and the telemetry's pure figures; nothing that writes to the terminal (console,
# dashboard), touches files or processes (jobs, hostside, backends, output, supervisor, watch)
# or holds state across threads (telemetry.model, telemetry.endpoint).
VIEW_MAY_IMPORT = ("launchkit.view", "launchkit.core", "launchkit.errors", "launchkit.telemetry.view")
# and of the standard library, nothing that reaches outside the process or reads the clock
VIEW_EFFECTS = frozenset(
    {"os", "sys", "subprocess", "socket", "threading", "signal", "shutil", "time", "termios", "select",
     "pathlib", "io", "tempfile", "multiprocessing", "asyncio"}
)  # fmt: skip


def view_breaks() -> list[str]:
    bad = []
    for name, path in MODULES.items():
        if name != "launchkit.view" and not name.startswith("launchkit.view."):
            continue
        for raw, line in imports_of(name, path):
            top = raw.split(".")[0]
            inside = internal(raw)
            if inside is not None and inside.startswith("launchkit"):
                if not any(inside == ok or inside.startswith(ok + ".") for ok in VIEW_MAY_IMPORT):
                    bad.append(f"{where(name, line)}: {name} imports {inside}")
            elif top in VIEW_EFFECTS:
                bad.append(f"{where(name, line)}: {name} imports {raw}")
    return bad


def test_the_view_is_pure() -> None:
    """launchkit.view builds and renders states, nothing else: the effects around it (sampling
    /proc, the dashboard's Live, the live file) are launchkit.watch's and launchkit.dashboard's."""
    bad = view_breaks()
    assert not bad, (
        f"view/ may import only {', '.join(VIEW_MAY_IMPORT)} of launchkit, no effects:\n" + "\n".join(bad)
    )
