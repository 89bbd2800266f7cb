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


def test_route_to_prefers_ipv4(monkeypatch) -> None:
    """``localhost`` resolves to ``::1`` first on Debian; ps-lite reads DMLC_PS_ROOT_URI as IPv4."""
    import socket

    from launchkit.hostside import netif

    infos = [
        (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", 0, 0, 0)),
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 0)),
    ]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: list(infos))
    assert netif.route_to("localhost") == "127.0.0.1"
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: infos[:1])
    assert netif.route_to("localhost") == "::1"  # only IPv6: still an answer


def test_route_to_a_name_that_does_not_resolve() -> None:
    from launchkit.hostside.netif import route_to

    assert route_to("trainer-box.invalid") is None
