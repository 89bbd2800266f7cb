"""One worker of a job with parameter servers that uses the KV store and the collectives at once,
over one registration with the scheduler.

>>> both = Joint.join()              # every worker of a -s 1 (or more) job
>>> both.kv.pushpull(3, grad, out)   # the parameter server (``kv.create("dist_sync")``)
>>> total = both.group.allreduce(x)  # the workers' collectives (servers are not members)
>>> both.close()                     # every worker: leave the links, finish the job once

The node (``node.postoffice.Postoffice``) is joined once, with the parameter server's message
kinds and the collectives' on its transport and the whole book (the collectives link every pair
of workers); the parameter server's client and the collective links are its two customers. The
KV store owns the node: its ``close`` finishes the job at the scheduler (one finish per worker)
and stops the node; the group's ``close`` says bye to the other workers and closes its links only.
The object is handed over explicitly (the torch ``Runtime`` holds one); nothing is process-global.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import trainer_core.kv as kv
import trainer_core.metrics as metrics
from trainer_core.collective.job import SCHEMA as COLLECTIVE_SCHEMA
from trainer_core.collective.job import JobGroup, join
from trainer_core.config import NodeConfig
from trainer_core.errors import ConfigError
from trainer_core.kv.api import KVStore
from trainer_core.kv.dist import DistKVStore
from trainer_core.log import get_logger
from trainer_core.node.book import ALL
from trainer_core.node.postoffice import Postoffice
from trainer_core.ps import protocol as ps_protocol

#: what a worker that is both decodes: the node layer's kinds, the parameter server's, the collectives'
SCHEMA = ps_protocol.SCHEMA | COLLECTIVE_SCHEMA


class Joint:
    """A worker's node and its two customers: ``kv`` (the parameter server's store) and ``group``
    (the workers' collective group)."""

    def __init__(self, node: Postoffice, store: KVStore, group: JobGroup) -> None:
        self.node = node
        self.kv = store
        self.group = group
        self._closed = False

    @classmethod
    def join(
        cls,
        environ: Mapping[str, str] | None = None,
        name: str = "dist_sync",
        log: logging.Logger | None = None,
        exit_on_failure: bool = True,
        **group_options: Any,
    ) -> Joint:
        """Join the job of ``environ`` (default: this process's) as a worker, once; then the KV store
        of type ``name`` and the group (``group_options``: ``collective.join``'s) on that node. A job
        without servers is a ``ConfigError`` (use ``collective.join`` alone)."""
        env = dict(environ) if environ is not None else None
        cfg = NodeConfig.from_environ(env, role="worker")
        if cfg.env.num_servers < 1:
            raise ConfigError(
                "a worker that uses the KV store and the collectives needs parameter servers: launch "
                "with -s 1 or more (a job without servers uses trainer_core.collective alone)"
            )
        log = log or get_logger(cfg.verbose)
        node = Postoffice.join(cfg, log, SCHEMA, needs=ALL)
        store: KVStore | None = None
        try:
            metrics.report(registered=1)  # the first report says this worker registered
            store = kv.create(name, env, node=node)
            group = join(env, log, node=node, **group_options)
        except BaseException:
            if isinstance(store, DistKVStore):  # (the job cannot go on without this worker's group)
                store.abort("a worker could not form its collective group")
            else:
                node.stop()
                node.close_transport()
            raise
        if exit_on_failure:
            node.exit_on_failure()
        return cls(node, store, group)

    def close(self) -> None:
        """Leave the collective links (queued operations finished first), then finish the job
        through the KV store, which stops the node. Every worker calls it at the end."""
        if self._closed:
            return
        self._closed = True
        try:
            self.group.close()
        finally:
            self.kv.close()
