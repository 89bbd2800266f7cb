"""tests/tiers.py: each test's tier from its folder, fixtures and code, and the check that makes a
test tiered unit fail when it starts a process. Run on small suites of their own (pytester)."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]
# the suites below start processes on purpose, which the guard of this test itself would refuse
pytestmark = pytest.mark.proc

CONFTEST = """
import pytest
from tests.tiers import guard, pytest_collection_modifyitems, tier_check

@pytest.fixture
def sshd_loopback():
    return "stand-in"

@pytest.fixture
def mxnet_python():
    return "stand-in"

@pytest.fixture
def child():
    import subprocess
    return subprocess.run(["true"]).returncode
"""

SUITE = """
import os
import subprocess

import pytest


def helper():  # outside tests/, so the scan does not read it
    return subprocess.run(["true"]).returncode


def test_pure():
    assert sum([1, 2]) == 3


def test_direct():
    assert subprocess.run(["true"]).returncode == 0


def test_through_a_fixture(child):
    assert child == 0


def test_on_the_loopback(sshd_loopback):
    assert sshd_loopback


def test_with_mxnet(mxnet_python, sshd_loopback):
    assert mxnet_python


@pytest.mark.proc
def test_marked(sshd_loopback):
    assert helper() == 0


def test_unmarked_helper():
    assert helper() == 0


def test_caught():
    try:
        helper()
    except Exception:
        pass


def test_forks():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=SUITE)
    return pytester


def tier_of(pytester: pytest.Pytester) -> dict[str, str]:
    found = {}
    for name in ("unit", "proc", "cluster", "compat", "gpu"):
        result = pytester.runpytest("--co", "-q", "-m", name)
        for line in result.outlines:
            if "::" in line:
                found[line.split("::")[1]] = name
    return found


def test_each_test_gets_the_tier_of_its_code_its_fixtures_or_its_mark(suite: pytest.Pytester) -> None:
    assert tier_of(suite) == {
        "test_pure": "unit",
        "test_direct": "proc",
        "test_through_a_fixture": "proc",
        "test_on_the_loopback": "cluster",
        "test_with_mxnet": "compat",
        "test_marked": "proc",  # a written mark wins over the fixtures
        "test_unmarked_helper": "unit",
        "test_caught": "unit",
        "test_forks": "proc",
    }


def test_a_test_tiered_unit_that_starts_a_process_fails_even_where_it_caught_the_refusal(
    suite: pytest.Pytester,
) -> None:
    result = suite.runpytest("-m", "unit", "-p", "no:cacheprovider")
    outcomes = {r.nodeid.split("::")[1]: r for r in result.reprec.getreports("pytest_runtest_logreport")}
    failed = sorted({name for name, r in outcomes.items() if r.failed})
    assert failed == ["test_caught", "test_unmarked_helper"]
    text = result.stdout.str()
    assert "is tiered unit" in text and "subprocess.Popen(['true'])" in text
    assert "@pytest.mark.proc" in text


def test_the_other_tiers_run_unguarded(suite: pytest.Pytester) -> None:
    result = suite.runpytest("-m", "not unit", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=6)
