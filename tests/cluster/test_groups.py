"""tests/cluster/groups.py: each cluster and compat test's xdist group, from what it holds."""

from __future__ import annotations

import pytest

from tests.cluster.groups import group_of, held, in_nodeid, merged

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.unit  # (it collects a small suite in this process; nothing is started)


def test_a_test_holds_what_its_fixtures_and_its_marks_name() -> None:
    assert held(["tmp_path", "netns_hosts", "netns_session"], []) == {"netns"}
    assert held(["slurm_netns"], []) == {"netns", "slurm_netns"}
    assert held(["sshd_loopback", "node_python", "host_python", "mxnet_python"], []) == set()
    assert held(["slurm_local"], ["sge"]) == {"slurm", "sge"}
    with pytest.raises(
        ValueError,
        match=r"holds\('slurm-sbatch'\): expected one of \['netns', 'sge', 'slurm', 'slurm_netns'\]",
    ):
        held([], ["slurm-sbatch"])


def test_resources_held_together_share_one_group_and_the_others_stay_apart() -> None:
    groups = merged([frozenset({"slurm_netns"}), frozenset({"sge"}), frozenset(), frozenset({"slurm"})])
    assert groups == {"slurm_netns": "slurm_netns", "sge": "sge", "slurm": "slurm"}
    groups = merged([frozenset({"slurm_netns"}), frozenset({"sge", "slurm"}), frozenset({"sge"})])
    assert groups == {"slurm_netns": "slurm_netns", "sge": "sge+slurm", "slurm": "sge+slurm"}
    assert group_of(frozenset({"slurm"}), groups) == "sge+slurm"
    assert group_of(frozenset(), groups) is None


def test_the_namespace_hosts_group_nothing_each_worker_has_a_subnet_of_its_own() -> None:
    holdings = [frozenset({"netns"}), frozenset({"netns", "sge"}), frozenset({"netns", "slurm_netns"})]
    groups = merged(holdings)
    assert groups == {"sge": "sge", "slurm_netns": "slurm_netns"}  # netns joins no two groups
    assert [group_of(h, groups) for h in holdings] == [None, "sge", "slurm_netns"]


CONFTEST = """
import pytest
from tests.tiers import pytest_collection_modifyitems as tiers
from tests.cluster.groups import MARK_HELP, regroup


def pytest_configure(config):
    config.addinivalue_line("markers", MARK_HELP)


def pytest_collection_modifyitems(items):
    tiers(items)
    regroup(items)


@pytest.fixture
def netns_hosts():
    return "stand-in"


@pytest.fixture(scope="module")
def slurm_netns():
    return "stand-in"


@pytest.fixture
def sge_local():
    return "stand-in"


@pytest.fixture
def slurm_local():
    return "stand-in"


@pytest.fixture
def sshd_loopback():
    return "stand-in"


@pytest.fixture
def mxnet_python():
    return "stand-in"
"""

SUITE = """
import pytest


def test_pure():
    pass


def test_hosts(netns_hosts, sshd_loopback):
    pass


def test_loopback(sshd_loopback):
    pass


def test_grid_engine(sge_local):
    pass


@pytest.mark.cluster  # (as in tests/cluster/)
@pytest.mark.parametrize("engine", ["mpirun", pytest.param("sge", marks=pytest.mark.holds("sge"))])
def test_asks_at_run_time(engine):
    pass


def test_hosts_and_grid_engine(netns_hosts, sge_local):
    pass


def test_slurm_on_hosts(slurm_netns):
    pass


def test_mxnet(mxnet_python):
    pass


def test_mxnet_under_slurm(mxnet_python, slurm_local):
    pass
"""


def test_each_cluster_test_gets_the_group_of_what_it_holds_and_the_others_none(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=SUITE)
    items, _ = pytester.inline_genitems()
    groups = {}
    for item in items:
        marks = [m.args for m in item.iter_markers("xdist_group")]
        assert len(marks) <= 1, (item.nodeid, marks)  # tiers.py's one group for all is gone
        groups[item.name] = marks[0][0] if marks else None
    assert groups == {
        "test_pure": None,  # a unit test: never grouped
        "test_hosts": None,  # each worker has its own subnet
        "test_hosts_and_grid_engine": "sge",
        "test_slurm_on_hosts": "slurm_netns",  # (its module's Slurm starts once)
        "test_loopback": None,  # each worker starts its own sshd
        "test_grid_engine": "sge",
        "test_asks_at_run_time[mpirun]": None,  # a cluster test that holds nothing
        "test_asks_at_run_time[sge]": "sge",
        "test_mxnet": None,
        "test_mxnet_under_slurm": "slurm",
    }

    # what --dist loadgroup's scheduler reads: the group as the node id's suffix, added once
    item = next(i for i in items if i.name == "test_grid_engine")
    in_nodeid(item, "sge")
    in_nodeid(item, "sge")
    assert item.nodeid == "test_suite.py::test_grid_engine@sge"
