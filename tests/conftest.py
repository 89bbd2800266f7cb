"""Shared fixtures: every test gets its own LAUNCHKIT_HOME."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def launchkit_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    home = tmp_path_factory.mktemp("lkhome")
    monkeypatch.setenv("LAUNCHKIT_HOME", str(home))
    monkeypatch.setenv("NO_COLOR", "1")
    return home
