"""The links from a node to the other nodes of the book (``open_links``), each opened by the
transport's channel factory (``transport/dial.py``, which says which channels are chosen).

A worker reaches the servers this way (``ps.routes``) and, as well, the other workers (they
listen too).
"""

from __future__ import annotations

import logging

from trainer_core.config import NodeConfig
from trainer_core.node.book import NodeInfo
from trainer_core.transport.control import Transport
from trainer_core.transport.dial import Link, open_link


def open_links(
    cfg: NodeConfig, nodes: tuple[NodeInfo, ...], transport: Transport, log: logging.Logger, role: str
) -> list[Link]:
    """Connect to every node of ``nodes`` (the book's ``role`` nodes; closing what was opened if one fails)."""
    links: list[Link] = []
    try:
        for s in nodes:
            links.append(open_link(s, cfg, f"{role} {s.rank}", log, transport.trace, transport))
    except BaseException:
        for link in links:
            for ch in link.channels():
                ch.close()
        raise
    return links
