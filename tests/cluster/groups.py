"""Which tests of the cluster and compat tiers may run side by side (pytest-xdist, --dist loadgroup).

Under ``--dist loadgroup`` the tests of one xdist group run in one worker, one after the other,
and a test without a group goes to whichever worker is free. A test's group is named after what it
holds that only one test (or one worker) at a time may hold:

    sge          Grid Engine's qmaster and execd, on the machine's fixed ports 6444/6445 (sge_local)
    slurm        the session's Slurm cluster (slurm_local), so that it is started once, in one worker
    slurm_netns  a module's Slurm cluster on namespace hosts (slurm_netns, module scope), so that it
                 is started once, in one worker

The namespace hosts (``netns``: netns_session, netns_hosts, slurm_netns) make no group: every
worker has a subnet of its own (10.231.N.0/24 for worker gwN, its bridge and its lock,
tests/cluster/subnets.py), so a test that makes namespace hosts may run in any worker, beside
another worker's. What else needs no group: ``sshd_loopback`` (each worker that needs one starts
its own, on a free port), ``node_python`` (a copy per worker), ``host_python`` and
``mxnet_python`` (venvs made once, under a file lock), ``mpirun`` on this machine (each job's own
session directory) and the YARN stand-in (one per test, on a free port).

A test that reaches one of these without asking for its fixture by name (``request.
getfixturevalue``, or a child process that creates namespace hosts) says so with
``@pytest.mark.holds("sge")`` (on the test, its module, or a ``pytest.param``). Where a test
holds two grouped resources, their groups become one: the worker that runs it must run both.

``tests/tiers.py`` puts every cluster and compat test in one group (``engines``), which is what a
run that does not load this package's conftest gets; ``regroup`` (the collection hook of
tests/cluster/conftest.py) replaces that group by the one above, or by none. docs/testing.md.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from tests.tiers import SHARED, SHARED_GROUP

FIXTURES = {
    "netns_session": ("netns",),
    "netns_hosts": ("netns",),
    "slurm_netns": ("netns", "slurm_netns"),
    "sge_local": ("sge",),
    "slurm_local": ("slurm",),
}
RESOURCES = frozenset(r for held in FIXTURES.values() for r in held)
#: What every worker has a copy of (its own subnet): holding it groups nothing.
PER_WORKER = frozenset({"netns"})
MARK = "holds"
MARK_HELP = (
    f"{MARK}(*resources): what a test holds beyond its fixtures' names ({', '.join(sorted(RESOURCES))})"
)


def held(fixtures: Iterable[str], marked: Iterable[str]) -> frozenset[str]:
    """The resources a test holds: those of its fixtures, and those written in its marks."""
    out = {r for f in fixtures for r in FIXTURES.get(f, ())}
    for name in marked:
        if name not in RESOURCES:
            raise ValueError(f"@pytest.mark.{MARK}({name!r}): expected one of {sorted(RESOURCES)}")
        out.add(name)
    return frozenset(out)


def merged(holdings: Iterable[frozenset[str]]) -> dict[str, str]:
    """Each grouped resource's group: resources held together by one test share a group (their
    names joined, sorted: ``sge+slurm``); a resource never held with another is a group of its
    own. Per-worker resources (``netns``) have none."""
    groups: list[set[str]] = []
    for holding in holdings:
        joined = set(holding - PER_WORKER)
        for group in [g for g in groups if g & joined]:
            joined |= group
            groups.remove(group)
        if joined:
            groups.append(joined)
    return {r: "+".join(sorted(group)) for group in groups for r in group}


def group_of(holding: frozenset[str], groups: dict[str, str]) -> str | None:
    """The xdist group of a test that holds ``holding`` (None: it may run in any worker)."""
    grouped = holding - PER_WORKER
    return groups[min(grouped)] if grouped else None


def regroup(items: list[pytest.Item], loadgroup: bool = False) -> None:
    """Give every cluster and compat test its group by what it holds, or none. ``loadgroup``: this
    is an xdist worker of a ``--dist loadgroup`` run (see ``in_nodeid``)."""
    shared = [item for item in items if any(item.get_closest_marker(t) is not None for t in SHARED)]
    holdings = {
        item.nodeid: held(
            getattr(item, "fixturenames", ()),
            (name for mark in item.iter_markers(MARK) for name in mark.args),
        )
        for item in shared
    }
    groups = merged(holdings.values())
    for item in shared:
        item.own_markers[:] = [
            m for m in item.own_markers if not (m.name == "xdist_group" and m.args == (SHARED_GROUP,))
        ]
        group = group_of(holdings[item.nodeid], groups)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group), append=False)
            if loadgroup:
                in_nodeid(item, group)


def in_nodeid(item: pytest.Item, group: str) -> None:
    """Append ``@group`` to the test's node id, as xdist's worker does, where that did not take.

    The scheduler of ``--dist loadgroup`` reads a test's group from that suffix. pytest-xdist 3.8
    sets it by assigning ``item._nodeid``, which pytest 9.2 no longer reads (its ``nodeid`` comes
    from ``item._id``): the groups were silently ignored and every test went to any worker.
    """
    suffix = f"@{group}"
    if item.nodeid.endswith(suffix) or not hasattr(item, "_id"):
        return
    from _pytest.nodeid import NodeId  # (pytest >= 9.2, where nodeid is read from _id)

    item._id = NodeId.parse(item.nodeid + suffix)  # type: ignore[attr-defined]
