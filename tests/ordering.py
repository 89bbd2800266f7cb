"""The order the xdist workers run the tests in: the longest first, so that no worker ends alone.

pytest-xdist hands out the collected tests in their order, a chunk at a time, and a run ends when
its last worker does. A long test near the end keeps one worker busy after the others finished:
a 90 s test there adds up to 90 s to the run. Under xdist (and only there: a run in one process
keeps the files' order) the tests run in this order, each group in its collected order:

    0  the cluster and compat tiers, one group as they were collected (under ``--dist
       loadgroup`` one worker takes them all, the longest share; module fixtures stay whole)
    1  tests marked ``slow`` (seconds each: whole trainings, jobs killed and restarted)
    2  the proc and gpu tiers (processes started: tenths of a second to seconds)
    3  the unit tier (milliseconds each: what fills the other workers' last seconds)

The sort is stable and the same in every worker (xdist requires the same collection in each).
It needs xdist to hand the tests out one at a time (``--maxschedchunk 1``, set here unless given):
by default its load scheduler gives each worker a quarter of its share at once and refills in
large chunks, never taking back what it gave, so a worker handed the first hundreds of the
longest tests ends long after the others (a simulation over one run's per-test times, 2 workers:
the end at 1.55 times the even share with the default chunks, 1.00 one at a time).
A module's tests of different ranks run apart, so a module-scoped fixture they share is made once
per group (tests/conftest.py registers this module; docs/testing.md).
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from tests.tiers import SHARED

RANKS = {"slow": 1, "proc": 2, "gpu": 2, "unit": 3}


def rank(marks: Iterable[str]) -> int:
    """Where a test with these marks runs: 0 first, 3 last (the module's docstring)."""
    names = set(marks)
    if names & set(SHARED):
        return 0
    return min((RANKS[n] for n in names if n in RANKS), default=RANKS["proc"])


def longest_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` sorted by ``rank`` of their marks, stable."""
    return sorted(items, key=lambda item: rank(m.name for m in item.iter_markers()))


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("xdist") and config.getoption("maxschedchunk", None) is None:
        config.option.maxschedchunk = 1


@pytest.hookimpl(trylast=True)  # after tests.tiers has marked every test with its tier
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput"):  # a pytest-xdist worker
        items[:] = longest_first(items)
