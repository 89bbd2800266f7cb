"""Two ends of a real channel in one process, for the transport tests."""

from __future__ import annotations

import select
import threading
import time
from collections.abc import Callable

from trainer_core.transport.channel import Channel, Listener


def accept_pair(
    listener: Listener, connect: Callable[[], Channel], bound_s: float = 20.0
) -> tuple[Channel, Channel]:
    """Connect (in a thread: its handshake blocks) while this thread accepts and drives the
    accepted end's side of the handshake through ``receive``, as a serving loop does. Returns
    (the connecting end, the accepted end)."""
    box: list[Channel | BaseException] = []

    def run() -> None:
        try:
            box.append(connect())
        except BaseException as exc:
            box.append(exc)

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + bound_s
    accepted: list[Channel] = []
    while not accepted:
        select.select([listener.pollable()], [], [], 0.1)
        accepted = listener.accept()
        assert time.monotonic() < deadline, "no connection came"
    end = accepted[0]
    while not box:
        if end.wait(0.05):
            assert end.receive(lambda _m: None), "the handshake failed"
        assert time.monotonic() < deadline, "the handshake did not end"
    t.join(bound_s)
    client = box[0]
    assert isinstance(client, Channel), client
    return client, end
