"""Transports: how bytes move between the nodes of a job.

The bottom layer: it imports nothing of ``ps``, ``kv`` or ``train``. ``channel`` is the one
interface the roles use (``Channel``, ``Peer``, ``Received``, ``Listener``, ``Poller``); behind it
``control`` is ZeroMQ (CURVE; registration, barriers, heartbeats, data with ``PS_ENCRYPT=1``),
``unix`` the same-host header channel, ``tcp`` the cross-host data stream (framing in ``stream``)
and ``memory`` an in-process pair for tests. ``shm`` holds shared-memory segments, ``host`` this
machine's identity and addresses, ``auth`` the handshakes and keys, ``wire`` the message format
(docs/wire.md).
"""
