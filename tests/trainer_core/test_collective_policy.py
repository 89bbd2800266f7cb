"""The algorithm choice (trainer_core.collective.policy)."""

from __future__ import annotations

import pytest

from trainer_core.collective import Thresholds, Topology, choose, policy


def test_size_picks_doubling_then_ring() -> None:
    th = Thresholds(ring_min_bytes=1000)
    assert choose(999, None, th) == "recursive_doubling"
    assert choose(1000, None, th) == "ring"
    assert choose(0, None, Thresholds()) == "recursive_doubling"


def test_topology_picks_hierarchical_only_with_several_hosts_of_several_ranks() -> None:
    th = Thresholds(ring_min_bytes=1000, hierarchical_min_bytes=10)
    assert choose(100, Topology.of(["a", "a", "b", "b"]), th) == "hierarchical"
    assert choose(5, Topology.of(["a", "a", "b", "b"]), th) == "recursive_doubling"
    assert choose(100, Topology.of(["a", "a", "a"]), th) == "recursive_doubling"  # one host
    assert choose(5000, Topology.of(["a", "b", "c"]), th) == "ring"  # one rank per host


def test_forced_algorithm_and_bad_thresholds() -> None:
    assert choose(1 << 30, None, Thresholds(force="recursive_doubling")) == "recursive_doubling"
    with pytest.raises(ValueError, match="needs the rank -> host map"):
        choose(1, None, Thresholds(force="hierarchical"))
    with pytest.raises(ValueError, match="threshold segment_bytes must be"):
        Thresholds(segment_bytes=0)
    with pytest.raises(ValueError, match="threshold ring_min_bytes must be"):
        Thresholds(ring_min_bytes=-1)


def test_topology_leaders_and_locals() -> None:
    topo = Topology.of(["b", "a", "b", "a", "c"])
    assert topo.leaders() == (0, 1, 4)
    assert topo.local(2) == (0, 2) and topo.local(3) == (1, 3)
    assert (topo.nhosts, topo.max_local) == (3, 2)


def test_measured_defaults_and_the_shared_memory_choice() -> None:
    """The defaults measured on one host (docs/collectives.md): the ring from 2 MiB; with a
    segment and every rank on the host, shm at every size, split by block from 1 MiB (16 MiB for
    two local ranks); several hosts stay hierarchical."""
    from trainer_core.collective.policy import shm_split

    th = Thresholds()
    assert choose((2 << 20) - 1, None, th) == "recursive_doubling"
    assert choose(2 << 20, None, th) == "ring"
    one = Topology.of(["a"] * 4)
    assert {choose(n, one, th, shm=True) for n in (0, 1, 1 << 20, 1 << 30)} == {"shm"}
    assert choose(1 << 30, one, th) == "ring"  # no segment (PS_SHM=0): over sockets
    assert choose(4, Topology.of(["a", "a", "b", "b"]), th, shm=True) == "hierarchical"
    assert not shm_split((1 << 20) - 1, 4, th) and shm_split(1 << 20, 4, th)
    assert not shm_split((16 << 20) - 1, 2, th) and shm_split(16 << 20, 2, th)
    assert choose(8, one, Thresholds(force="ring"), shm=True) == "ring"  # overridable
    with pytest.raises(ValueError, match="needs every rank on one host"):
        choose(8, Topology.of(["a", "b"]), Thresholds(force="shm"), shm=True)


def test_pipeline_pieces_of_the_hierarchical_path() -> None:
    """4 MiB pieces, at most ``most``, one (not pipelined) below two pieces; a zero size refused."""
    th = Thresholds()
    assert policy.pipeline_pieces(40_000_000, th, 14) == 9
    assert policy.pipeline_pieces(8 * 1024 * 1024 - 1, th, 14) == 1
    assert policy.pipeline_pieces(1 << 30, th, 14) == 14
    assert policy.pipeline_pieces(0, Thresholds(pipeline_piece_bytes=1), 14) == 1
    with pytest.raises(ValueError, match="pipeline_piece_bytes must be"):
        Thresholds(pipeline_piece_bytes=0)
