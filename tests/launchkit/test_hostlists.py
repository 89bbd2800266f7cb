"""Hosts from an engine's own description of an allocation (pure parsing), asked of the backend
that names the engine (``launchkit hosts list --from NAME``)."""

from __future__ import annotations

import pytest

from launchkit.backends.hostlists import (
    parse_mpi_hostfile,
    parse_pe_hostfile,
    tasks_per_node,
)
from launchkit.cli.hosts import given_hosts
from launchkit.errors import UsageError


def test_slurm_tasks_per_node() -> None:
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert tasks_per_node("4") == [4]
    with pytest.raises(ValueError, match="expected N or N"):
        tasks_per_node("2(3)")


def test_pe_hostfile() -> None:
    hosts = parse_pe_hostfile("node1 4 all.q@node1 UNDEFINED\nnode2 2 all.q@node2 UNDEFINED\n")
    assert [(h.name, h.slots) for h in hosts] == [("node1", 4), ("node2", 2)]
    with pytest.raises(UsageError, match=r"pe:2: expected `HOST SLOTS"):
        parse_pe_hostfile("node1 4 q p\nnode2\n", "pe")


def test_mpi_hostfiles() -> None:
    hosts = parse_mpi_hostfile("# cluster\na slots=4 max_slots=8\nb:2\nc\n", "hf")
    assert [(h.name, h.slots) for h in hosts] == [("a", 4), ("b", 2), ("c", None)]


def test_missing_variables_are_clear_errors() -> None:
    with pytest.raises(UsageError, match="PE_HOSTFILE is not set"):
        given_hosts("sge", {})
    with pytest.raises(UsageError, match="SLURM_JOB_NODELIST is not set"):
        given_hosts("slurm", {})
    with pytest.raises(UsageError, match="OMPI_MCA_orte_default_hostfile"):
        given_hosts("mpi", {})
    with pytest.raises(UsageError, match="expected one of mpi, sge, slurm"):
        given_hosts("pbs", {})
