"""The scheduler of a job that has no scheduler process, as a thread of worker 0's process.

A job without servers (``launchkit launch -s 0``) runs the user's command on the workers only, as
torchrun and the dmlc tracker do; the launcher then says ``LAUNCHKIT_ROOT_SERVER=worker 0`` and
points ``DMLC_PS_ROOT_URI``/``DMLC_PS_ROOT_PORT`` at worker 0's host. Worker 0 serves the
rendezvous there as torch's TCP store is served by rank 0: ``Postoffice.join`` starts the node
layer's ``Scheduler`` in a thread before it registers, and the other workers join it as they join
a scheduler process. Liveness, barrier, finish and abort are the scheduler's, unchanged; worker
0's own death ends the thread with it, which the others see as a silent scheduler (named
``worker 0``, ``ROOT_NAME``) or as closed channels. See docs/collectives.md.
"""

from __future__ import annotations

import logging
import threading

from trainer_core.config import NodeConfig
from trainer_core.node import protocol
from trainer_core.node.scheduler import Scheduler
from trainer_core.transport import wire

#: how the other nodes name the root when worker 0 serves it (a silent root is worker 0's failure)
ROOT_NAME = "worker 0"


def serves_root(cfg: NodeConfig) -> bool:
    """Whether this node serves the job's root: worker 0 of a job with no scheduler process."""
    return cfg.env.root_in_worker0 and cfg.role == "worker" and cfg.env.role_rank == 0


def root_name(cfg: NodeConfig) -> str:
    """The name a node gives the root it joins (in a failure it reports)."""
    return ROOT_NAME if cfg.env.root_in_worker0 else "scheduler"


class RootServer:
    """The scheduler running in a thread of this process. It binds at once (a taken port fails
    the join with the reason), then serves until the job ends (every worker finished, or an abort)
    or ``stop``."""

    def __init__(self, cfg: NodeConfig, log: logging.Logger, schema: wire.Schema = protocol.SCHEMA) -> None:
        self.scheduler = Scheduler(cfg, log, schema=schema)
        self.exit_code: int | None = None
        self._thread = threading.Thread(target=self._run, name="trainer_core-scheduler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.exit_code = self.scheduler.run()

    def wait(self, timeout: float) -> bool:
        """Whether the thread has ended (the job ended) within ``timeout`` seconds."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self) -> None:
        """End the thread (at once if the job has not ended) and wait for it: its socket is closed."""
        self.scheduler.stopping.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
