"""Shared fixtures: every test gets its own LAUNCHKIT_HOME; ``served_endpoints`` spies on the
metrics endpoints a launch serves. Every test is marked with its tier (tests/tiers.py)."""

from __future__ import annotations

import pytest

from tests import tiers
from tests.tiers import guard  # noqa: F401  (the unit tier's check, asked for by tier_check)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(tiers.tier(item))


def pytest_report_collectionfinish(items: list[pytest.Item]) -> str:
    return "tiers: " + ", ".join(f"{name} {n}" for name, n in tiers.counts(items).items())


@pytest.fixture(autouse=True)
def tier_check(request: pytest.FixtureRequest) -> None:
    """A test tiered unit runs with ``guard``: starting a process fails it."""
    if request.node.get_closest_marker("unit") is not None:
        request.getfixturevalue("guard")


@pytest.fixture(autouse=True)
def launchkit_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    home = tmp_path_factory.mktemp("lkhome")
    monkeypatch.setenv("LAUNCHKIT_HOME", str(home))
    monkeypatch.setenv("NO_COLOR", "1")
    return home


@pytest.fixture
def served_endpoints(monkeypatch: pytest.MonkeyPatch) -> list:
    """The metrics endpoints ``launching.run_job`` serves in this test, in order (None where it
    serves none), each with its ``model`` to look into."""
    from launchkit import launching

    served: list = []
    real = launching.serve

    def spy(*args, **kwargs):
        served.append(real(*args, **kwargs))
        return served[-1]

    monkeypatch.setattr(launching, "serve", spy)
    return served
