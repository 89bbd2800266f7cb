"""The address lookups the launcher and the hosts share (``launchkit.hostside.netif``)."""

from __future__ import annotations

import pytest

from launchkit.errors import UsageError
from launchkit.hostside.netif import interface_address, route_address
from launchkit.netutil import interface_address as checked_interface_address


def test_interface_address() -> None:
    assert interface_address("lo") == "127.0.0.1"
    assert interface_address("no-such-if0") is None
    assert checked_interface_address("lo") == "127.0.0.1"
    with pytest.raises(UsageError, match="no network interface named 'no-such-if0'"):
        checked_interface_address("no-such-if0")


def test_route_address() -> None:
    assert route_address("127.0.0.1") == "127.0.0.1"
    assert route_address("127.0.0.9") == "127.0.0.1"
    assert route_address("node1") is None  # not an address: no lookup here
