"""tests/ordering.py: under pytest-xdist the engines' group first, then slow, proc and unit tests,
each in its collected order; in one process the files' order."""

from __future__ import annotations

import re

import pytest

from tests.ordering import rank

pytest_plugins = ["pytester"]

CONFTEST = """
import pytest
from tests import ordering
from tests.tiers import pytest_collection_modifyitems, tier_check, guard

@pytest.fixture
def sshd_loopback():
    return "stand-in"

def pytest_configure(config):
    config.pluginmanager.register(ordering, "tests.ordering")
"""

SUITE = """
import subprocess

import pytest


def test_unit_a():
    pass


def test_proc_a():
    assert subprocess  # tiered proc by the name (tests/tiers.py), and starts none


@pytest.mark.slow
def test_slow_proc():
    assert subprocess


def test_unit_b():
    pass


def test_cluster(sshd_loopback):
    pass


@pytest.mark.slow
def test_slow_unit():
    pass


def test_proc_b():
    assert subprocess
"""

FILE_ORDER = [
    "test_unit_a",
    "test_proc_a",
    "test_slow_proc",
    "test_unit_b",
    "test_cluster",
    "test_slow_unit",
    "test_proc_b",
]


def test_the_engines_group_slow_proc_and_gpu_then_unit() -> None:
    assert rank(["cluster", "xdist_group"]) == rank(["compat", "slow"]) == 0
    assert rank(["proc", "slow"]) == rank(["unit", "slow"]) == 1
    assert rank(["proc"]) == rank(["gpu"]) == rank(["parametrize"]) == 2
    assert rank(["unit", "parametrize"]) == 3


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=SUITE)
    return pytester


def ran(result: pytest.RunResult) -> list[str]:
    return [
        m.group(1) for line in result.outlines if (m := re.search(r"::(test_\w+)", line)) and "PASSED" in line
    ]


@pytest.mark.proc  # xdist starts its worker as a process
def test_one_xdist_worker_runs_the_longest_first(suite: pytest.Pytester) -> None:
    result = suite.runpytest("-p", "no:cacheprovider", "-p", "xdist", "-n", "1", "-v")
    result.assert_outcomes(passed=7)
    assert ran(result) == [
        "test_cluster",
        "test_slow_proc",
        "test_slow_unit",
        "test_proc_a",
        "test_proc_b",
        "test_unit_a",
        "test_unit_b",
    ]


def test_one_process_keeps_the_files_order(suite: pytest.Pytester) -> None:
    result = suite.runpytest("-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=7)
    assert ran(result) == FILE_ORDER


def test_xdist_hands_the_tests_out_one_at_a_time_unless_told(suite: pytest.Pytester) -> None:
    assert suite.parseconfigure("-p", "xdist").option.maxschedchunk == 1
    assert suite.parseconfigure("-p", "xdist", "--maxschedchunk", "8").option.maxschedchunk == 8
