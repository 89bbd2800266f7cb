"""Authentication: ZeroMQ CURVE keypairs derived from the job secret.

Every node derives the same two keypairs from ``LAUNCHKIT_JOB_SECRET`` with keyed BLAKE2b
(one label per key). Bound sockets are CURVE servers with the *server* keypair; connecting
sockets are CURVE clients with the *client* keypair and must know the server public key.
Neither public key ever crosses the wire in the clear and the secret never does: a peer that
does not hold the secret cannot complete the CURVE handshake, so libzmq drops it before any
byte reaches the node. CURVE also encrypts every frame (docs/wire.md).

Across hosts the arrays can instead go over an unencrypted data channel (the default; set
``PS_ENCRYPT=1`` for CURVE there too): plain ZeroMQ sockets where every message carries an
HMAC-SHA256 of its header under a key derived from the secret, and servers accept only
increasing sequence numbers from each worker (no replay).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

import zmq
from zmq.utils import z85


@dataclass(frozen=True)
class CurveKeys:
    """z85-encoded keys, as ``zmq.Socket.curve_*`` options want them."""

    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes


def _derive(secret: str, label: bytes) -> bytes:
    digest = hashlib.blake2b(secret.encode(), key=b"launchkit-kv-curve-v1", person=label, digest_size=32)
    return z85.encode(digest.digest())


def derive_keys(secret: str) -> CurveKeys:
    """The job's CURVE keypairs (pure and deterministic: every node gets the same)."""
    if not secret:
        raise ValueError("empty job secret")
    server_secret = _derive(secret, b"server")
    client_secret = _derive(secret, b"client")
    return CurveKeys(
        server_public=zmq.curve_public(server_secret),
        server_secret=server_secret,
        client_public=zmq.curve_public(client_secret),
        client_secret=client_secret,
    )


@dataclass(frozen=True)
class MacKeys:
    """HMAC-SHA256 keys of the unencrypted data channel, one per direction."""

    to_server: bytes
    to_worker: bytes


def derive_mac_keys(secret: str) -> MacKeys:
    """The data channel's keys (pure; every node gets the same)."""
    if not secret:
        raise ValueError("empty job secret")

    def key(label: bytes) -> bytes:
        return hashlib.blake2b(
            secret.encode(), key=b"launchkit-kv-mac-v1", person=label, digest_size=32
        ).digest()

    return MacKeys(to_server=key(b"to-server"), to_worker=key(b"to-worker"))


def sign(key: bytes, header: bytes) -> bytes:
    """The MAC frame of a header on the data channel."""
    return hmac.new(key, header, hashlib.sha256).digest()


def verify(key: bytes, header: bytes, mac: bytes) -> bool:
    return hmac.compare_digest(sign(key, header), mac)
