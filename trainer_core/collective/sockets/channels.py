"""The channel between two workers (``open_channel``) and the same-host messages of
``netlinks.NetLinks``, whose bytes travel in a memfd passed with the header.

The same-host channel (``transport/unix.py``) carries headers only, with descriptors attached
(SCM_RIGHTS). A ``coll_data`` message on it says how many bytes it carries (``n``); unless that is
0, one descriptor comes with it: an anonymous file (``memfd``) holding the bytes, which the
sender writes, sends and closes, and the receiver reads straight into the posted receive (or
into a copy, when the message came first) and closes. Nothing is left in ``/dev/shm``. The
sender's ``send`` returns once the kernel holds the message; the receiving thread of every
worker always reads its channels, so it cannot wait for ever.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from trainer_core.config import NodeConfig
from trainer_core.node.book import NodeInfo
from trainer_core.transport import wire
from trainer_core.transport.channel import Channel, Trace
from trainer_core.transport.dial import open_link

from .handles import Recv


def open_channel(info: NodeInfo, cfg: NodeConfig, trace: Trace, log: logging.Logger) -> Channel:
    """A channel to worker ``info`` from the transport's factory (``transport/dial.py``): the
    same-host channel where it shares this machine (and ``PS_SHM`` is not 0), else (or if that
    cannot be connected) its TCP data channel."""
    return open_link(info, cfg, f"collective: worker {info.rank}", log, trace, frames=False).fast


def send(ch: Channel, header: wire.Header, data: memoryview) -> None:
    """Send ``header`` with ``data`` (bytes) in a fresh memfd (none for no bytes)."""
    if not len(data):
        ch.send(header)
        return
    fd = os.memfd_create("launchkit-collective", os.MFD_CLOEXEC)
    try:
        at = 0
        while at < len(data):
            at += os.write(fd, data[at:])
        ch.send(header, fds=[fd])
    finally:
        os.close(fd)


def read_into(fd: int, view: memoryview) -> None:
    """Fill ``view`` from the start of the file ``fd`` (``OSError`` if it is shorter)."""
    at = 0
    while at < len(view):
        n = os.preadv(fd, [view[at:]], at)
        if n <= 0:
            raise OSError(f"the message's file holds {at} bytes, not {len(view)}")
        at += n


def read(fd: int, n: int) -> bytes:
    buf = bytearray(n)
    read_into(fd, memoryview(buf))
    return bytes(buf)


def deliver(
    ch: Channel,
    key: tuple[int, int],
    n: int,
    take_posted: Callable[[tuple[int, int]], Recv | None],
    keep: Callable[[tuple[int, int], bytes], None],
) -> None:
    """A received message of ``n`` bytes for ``key`` (its memfd is the channel's next descriptor):
    read straight into its posted receive (``take_posted``), or kept (``keep``)."""
    fd = ch.take_fds(1)[0] if n else -1
    try:
        op = take_posted(key)
        if op is not None and len(op.view) == n:
            read_into(fd, op.view)
            op.finish()
            return
        data = read(fd, n) if n else b""
    finally:
        if fd >= 0:
            os.close(fd)
    if op is not None:
        op.fill(data)  # (a length mismatch)
        return
    keep(key, data)
