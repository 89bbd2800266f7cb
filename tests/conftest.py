"""Shared fixtures: every test gets its own LAUNCHKIT_HOME; ``served_endpoints`` spies on the
metrics endpoints a launch serves. Every test is marked with its tier (tests/tiers.py); under
pytest-xdist the longest run first (tests/ordering.py)."""

from __future__ import annotations

import pytest

from tests import ordering
from tests.tiers import (  # noqa: F401  (each test's tier mark, and the unit tier's check)
    guard,
    pytest_collection_modifyitems,
    pytest_report_collectionfinish,
    tier_check,
)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(ordering, "tests.ordering")


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
