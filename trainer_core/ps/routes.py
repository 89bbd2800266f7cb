"""Which channels reach each server from a worker: the node layer's links (``node/reach.py``) to
the servers of the book; ``routes[i]`` reaches server ``i``."""

from __future__ import annotations

import logging

from trainer_core.config import NodeConfig
from trainer_core.node.book import Book
from trainer_core.node.reach import open_links
from trainer_core.transport.control import Transport
from trainer_core.transport.dial import Link

Route = Link


def open_routes(cfg: NodeConfig, book: Book, transport: Transport, log: logging.Logger) -> list[Route]:
    """Connect to every server of ``book`` (closing what was opened if one fails)."""
    return open_links(cfg, book.servers, transport, log, "server")
