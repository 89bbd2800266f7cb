"""Transports: how bytes move between the nodes of a job.

The bottom layer: it imports nothing of ``ps``, ``kv`` or ``train``. ``control`` is the ZeroMQ
control channel (registration, barriers, heartbeats, CURVE across hosts), ``unix`` the same-host
socket, ``tcp`` the cross-host stream, ``shm`` shared-memory segments; ``auth`` holds the
handshake and keys, ``wire`` the message format (docs/wire.md).
"""
