"""Transports: how bytes move between the nodes of a job.

The bottom layer, protocol-neutral: it imports nothing above it (``metrics``, ``node``, ``ps``,
``collective``, ``kv``, ``train``, ``torch``), and what a message means is the protocols'
business (``wire``: the envelope).
``channel`` is the one interface the layers above use (``Channel``, ``Peer``, ``Received``,
``Listener``, ``Poller``); behind it ``control`` is ZeroMQ (CURVE; registration, barriers,
heartbeats, data with ``PS_ENCRYPT=1``), ``unix`` the same-host header channel, ``tcp`` the
cross-host data stream (framing in ``stream``), ``memory`` an in-process pair for tests and
``datagram`` the metrics reports over UDP.
Channels are symmetric: either end may send, post and receive (``outbox``: what a ``post`` could
not send at once). ``devshm`` holds the shared-memory segments under /dev/shm, ``host`` this
machine's identity and addresses, ``auth`` the handshakes and keys, ``wire`` the envelope
(docs/wire.md).
"""
