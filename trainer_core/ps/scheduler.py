"""The scheduler of a parameter-server job: the node layer's ``Scheduler`` (``node/scheduler.py``),
speaking the parameter server's protocol too (its nodes' messages decode with ``ps.protocol``).

Run it with ``python -m trainer_core.ps.scheduler`` or by importing trainer_core with
``DMLC_ROLE=scheduler``.
"""

from __future__ import annotations

import logging
import sys

from trainer_core.config import NodeConfig
from trainer_core.node import scheduler
from trainer_core.ps import protocol
from trainer_core.transport.channel import Source


class Scheduler(scheduler.Scheduler):
    """``node.scheduler.Scheduler`` for the nodes of a parameter-server job."""

    def __init__(
        self, cfg: NodeConfig, log: logging.Logger | None = None, router: Source | None = None
    ) -> None:
        super().__init__(cfg, log, router, schema=protocol.SCHEMA)


def main(environ: dict[str, str] | None = None) -> int:
    """Entry point of ``python -m trainer_core.ps.scheduler``."""
    cfg = NodeConfig.from_environ(environ, role="scheduler")
    return Scheduler(cfg).run()


if __name__ == "__main__":
    sys.exit(main())
