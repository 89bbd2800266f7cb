"""The ResourceManager client's cleanup command (``python -m launchkit.backends.yarnrest stop``)."""

from __future__ import annotations

import os
import subprocess

import pytest

from launchkit.backends import yarnrest
from launchkit.backends.yarnrest import stop_argv

pytestmark = pytest.mark.timeout(20)


def test_reaper_cleanup_is_an_argv_and_the_module_has_a_usage() -> None:
    argv = stop_argv("http://rm:8088", "lk-x", "me")
    assert argv[1:] == ["-m", "launchkit.backends.yarnrest", "stop", "http://rm:8088", "lk-x", "--user", "me"]
    assert yarnrest.main(["nonsense"]) == 2


def test_module_runs_as_the_reapers_cleanup_command() -> None:
    res = subprocess.run(
        [*stop_argv("http://127.0.0.1:9", "lk-x", "me")],
        capture_output=True,
        text=True,
        timeout=15,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert res.returncode == 1 and "cannot reach the ResourceManager" in res.stderr
