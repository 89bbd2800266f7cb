"""Authentication: ZeroMQ CURVE keypairs derived from the job secret.

Every node derives the same two keypairs from ``LAUNCHKIT_JOB_SECRET`` with keyed BLAKE2b
(one label per key). Bound sockets are CURVE servers with the *server* keypair; connecting
sockets are CURVE clients with the *client* keypair and must know the server public key.
Neither public key ever crosses the wire in the clear and the secret never does: a peer that
does not hold the secret cannot complete the CURVE handshake, so libzmq drops it before any
byte reaches the node. CURVE also encrypts every frame (docs/wire.md).

The stream channels that carry arrays outside ZeroMQ (same host: ``unix.py``; across hosts,
unless ``PS_ENCRYPT=1``: ``tcp.py``) open with a challenge instead: the server sends a nonce
(``offer_nonce``) and each side proves the secret with an HMAC of it (``answer_challenge``,
``channel_key``, ``channel_proof``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
from dataclasses import dataclass

import zmq
from zmq.utils import z85

from trainer_core.errors import KVError

NONCE_BYTES = 16
PROOF_BYTES = 32


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


def channel_key(secret: str, label: bytes) -> bytes:
    """The key of a stream channel's handshake (``label`` names the channel; pure)."""
    if not secret:
        raise ValueError("empty job secret")
    return hashlib.blake2b(secret.encode(), key=label, digest_size=32).digest()


def channel_proof(key: bytes, who: bytes, nonce: bytes) -> bytes:
    """What ``who`` (``b"client"`` or ``b"server"``) answers to ``nonce``: HMAC-SHA256 under ``key``."""
    return hmac.new(key, who + nonce, hashlib.sha256).digest()


def offer_nonce(sock: socket.socket) -> bytes | None:
    """Server side of the challenge: send a just-accepted connection a fresh nonce, leaving it
    blocking; ``None`` (and closed) if that fails."""
    nonce = os.urandom(NONCE_BYTES)
    try:
        sock.setblocking(True)
        sock.settimeout(1.0)
        sock.sendall(nonce)
        sock.settimeout(None)
    except OSError:
        sock.close()
        return None
    return nonce


def answer_challenge(sock: socket.socket, key: bytes) -> bytes:
    """Client side of the challenge on a connected socket: read the server's nonce, prove the
    secret, check the server's proof; returns the nonce (``KVError`` if the server lacks the secret)."""
    nonce = _recv_exact(sock, NONCE_BYTES)
    sock.sendall(channel_proof(key, b"client", nonce))
    if not hmac.compare_digest(_recv_exact(sock, PROOF_BYTES), channel_proof(key, b"server", nonce)):
        raise KVError("the server does not hold the job secret")
    return nonce


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise KVError("connection closed during the handshake")
        data += chunk
    return data
