"""What ``netlinks.NetLinks`` says when something goes wrong: the errors it raises and the abort it
sends the scheduler when a peer dies."""

from __future__ import annotations

from dmlc_env.ending import say_peer_failed
from trainer_core.config import NodeConfig
from trainer_core.node import protocol as node_protocol
from trainer_core.node.book import scheduler_endpoint
from trainer_core.node.postoffice import Postoffice
from trainer_core.transport import wire

from .links import LinkError


def report(node: Postoffice, cfg: NodeConfig, name: str, reason: str, wait_s: float) -> None:
    """Tell the scheduler that node ``name`` died (unless the job failed already), so that it ends
    the job for every node naming it; wait (at most ``wait_s``) until its word comes back through
    the heartbeat thread, which the waits then raise first. On a channel of its own (the node's
    channel to the scheduler belongs to the thread that calls ``barrier`` and ``finish``)."""
    transport = node.transport
    if node.failure is not None or transport is None:
        return
    ch = transport.connect(scheduler_endpoint(cfg))
    try:
        ch.send(wire.Header(op=node_protocol.ABORT, src=node.name, body={"reason": reason, "node": name}))
        if not node.live.failed.wait(wait_s):
            say_peer_failed(name)  # for the launcher (the heartbeat thread says it with the abort)
    finally:
        ch.close(flush_s=0.0 if node.live.failed.is_set() else 1.0)


def send_failed(peer: int, where: str, exc: BaseException, gone: bool) -> LinkError:
    """The error of a send to ``peer`` that failed (``gone``: its channel closed)."""
    tail = ": it died or stopped, and the group is broken" if gone else ""
    return LinkError(f"collective: sending to rank {peer} ({where}) failed: {exc}{tail}", peer)


def mismatch(peer: int, where: str, rank: int, tag: int, got: int, expected: int) -> LinkError:
    return LinkError(
        f"collective: rank {peer} ({where}) sent {got} bytes to rank {rank} (tag {tag:#x}), which "
        f"expected {expected}; the ranks disagree on the operation",
        peer,
    )
