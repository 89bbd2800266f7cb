"""A node's listeners, where the other nodes of its job reach it (``Postoffice.join`` opens them)."""

from __future__ import annotations

from trainer_core.config import NodeConfig
from trainer_core.errors import KVError
from trainer_core.transport.channel import Listener, Trace
from trainer_core.transport.host import bind_and_publish_hosts
from trainer_core.transport.tcp import TcpListener
from trainer_core.transport.unix import UnixListener


def listen(cfg: NodeConfig, trace: Trace, into: list[Listener]) -> tuple[str, str]:
    """Open this node's listeners for the other nodes (same-host unless ``PS_SHM=0``, TCP data
    unless ``PS_ENCRYPT=1``), each added to ``into`` as it is made (the caller closes them, also
    when a later one fails: ``KVError``); returns what to publish: ``(local name, data endpoint)``.
    Every node of the job may be in its handshake with one at once: they connect as the book
    reaches them, all at the same moment (a listener that held 64 failed jobs of 256 workers)."""
    bind_host, publish_host = bind_and_publish_hosts(cfg.env.interface, cfg.env.node_host)
    peers = cfg.env.num_workers + cfg.env.num_servers
    local = data = ""
    if cfg.use_shm:
        try:
            unix = UnixListener(cfg.job_id, cfg.secret, trace, peers)
        except OSError as exc:
            raise KVError(f"cannot listen for same-host channels: {exc}") from None
        into.append(unix)
        local = unix.name
    if not cfg.encrypt:
        try:
            tcp = TcpListener(bind_host, cfg.secret, trace, peers)
        except OSError as exc:
            raise KVError(f"cannot listen for the data channel on {bind_host}: {exc}") from None
        into.append(tcp)
        data = f"tcp://{publish_host}:{tcp.port}"
    return local, data
