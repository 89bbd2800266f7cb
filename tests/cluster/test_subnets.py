"""tests/cluster/subnets.py: each xdist worker's subnet, and the names that say which subnet a
cluster's namespaces, links and state dirs belong to (the real clusters on two subnets at once:
tests/cluster/test_fixtures.py)."""

from __future__ import annotations

import pytest

from tests.cluster.subnets import MAX_SUBNETS, Subnet, tag_of, tag_subnet

pytestmark = pytest.mark.unit  # (pure functions; nothing is started)


def test_each_xdist_worker_has_a_subnet_of_its_own_and_any_other_process_subnet_0() -> None:
    assert Subnet.of_process({"PYTEST_XDIST_WORKER": "gw0"}) == Subnet(0)
    assert Subnet.of_process({"PYTEST_XDIST_WORKER": "gw2"}) == Subnet(2)
    assert Subnet.of_process({}) == Subnet(0)
    assert Subnet.of_process({"PYTEST_XDIST_WORKER": "master"}) == Subnet(0)
    s = Subnet(2)
    assert (s.prefix, s.cidr, s.bridge_address, s.host_address(1)) == (
        "10.231.2",
        "10.231.2.0/24",
        "10.231.2.1",
        "10.231.2.11",
    )
    with pytest.raises(ValueError, match=r"subnet index 100: expected 0 to 99 \(10\.231\.N\.0/24\)"):
        Subnet.of_process({"PYTEST_XDIST_WORKER": f"gw{MAX_SUBNETS}"})


def test_a_clusters_names_carry_its_subnet_and_fit_linux_link_names() -> None:
    tag = Subnet(99).new_tag()
    assert tag_subnet(tag) == 99 and tag.startswith("99-")
    names = [f"lkns-{tag}-200", f"lkbr{tag}", f"lkv{tag}h200", tag]
    assert [tag_of(n) for n in names] == [tag] * 4
    assert max(len(f"lkbr{tag}"), len(f"lkv{tag}h200")) <= 15  # IFNAMSIZ - 1
    # a tag of the names before the subnets were split belongs to subnet 0
    assert (tag_of("lkns-0a1f-3"), tag_subnet("0a1f")) == ("0a1f", 0)
    assert [tag_of(n) for n in ("lkns-x-1", "lock-0", "lkbr", "eth0")] == [None] * 4
