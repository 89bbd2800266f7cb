"""The KV store API: ``create(name)`` and the ``KVStore`` classes (MXNet's kvstore, reimplemented).

Types: ``local`` and ``device`` (one process), ``dist_sync``, ``dist_async``,
``dist_sync_device``, ``dist_async_device`` (a parameter-server job: the launcher, or the
``DMLC_*`` variables set by hand, start a scheduler, servers and workers). Keys are ints or
strings; values are numpy or cupy arrays (a compressed push of cupy values is summed and
encoded on their device, only the payload leaves it; otherwise a value goes to host memory once,
and a pull into a cupy output is copied up once: compressed, only its payload, decoded there).
Every method takes one key or a list of keys; a value may be a list of arrays (one per device),
summed on push, all filled on pull.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from trainer_core.config import NodeConfig
from trainer_core.errors import ConfigError
from trainer_core.kv.api import KVStore
from trainer_core.kv.local import LocalKVStore

if TYPE_CHECKING:
    from trainer_core.node.postoffice import Postoffice

TYPES = ("local", "device", "dist_sync", "dist_async", "dist_sync_device", "dist_async_device", "dist")

__all__ = ["TYPES", "KVStore", "LocalKVStore", "create"]


def create(
    name: str = "local", environ: dict[str, str] | None = None, node: Postoffice | None = None
) -> KVStore:
    """A KV store of type ``name``. With ``DMLC_ROLE`` set to ``scheduler`` or ``server`` this runs that
    role instead and exits the process when the job ends (as MXNet). A process is one worker of a
    job: creating the same dist type again returns the open store; another type, or any after
    ``close()``, is a ``ConfigError``. ``node``: this worker's node, joined already in this process
    (with the parameter server's kinds, ``ps.protocol.SCHEMA``, among its transport's, and the
    servers in its book), which another customer uses too (the collectives: one registration
    for both); the store's ``close`` finishes the job and stops it."""
    if name not in TYPES:
        raise ConfigError(f"unknown KV store type {name!r}; known: {', '.join(TYPES)}")
    if name in ("local", "device"):
        return LocalKVStore(name)
    env = os.environ if environ is None else environ
    role = env.get("DMLC_ROLE")
    if role in ("scheduler", "server"):
        from trainer_core.ps.roles import run_role_and_exit

        run_role_and_exit(role, environ)
    from trainer_core.kv.dist import DistKVStore

    cfg = NodeConfig.from_environ(environ, role="worker")
    job = (cfg.job_id, cfg.env.root_uri, cfg.env.root_port)
    before = _JOINED.get(job)
    if before is not None:
        return _again(before, name)
    if node is None:
        store = DistKVStore(name, cfg)
    else:
        from trainer_core.ps.client import WorkerClient

        if node.book.num_servers < 1:
            raise ConfigError(
                f"kvstore {name!r} needs at least one parameter server, and this job has none "
                "(launched with -s 0): start it with -s 1 or more"
            )

        store = DistKVStore(name, cfg, client=WorkerClient.on(node, cfg, node.log))
    _JOINED[job] = store
    return store


#: the worker store this process created per job (job id, scheduler address): a process is one worker
#: of a job, which the scheduler admits once
_JOINED: dict[tuple[str, str, int], KVStore] = {}


def _again(store: KVStore, name: str) -> KVStore:
    """What a second ``create`` of a dist store in this process gets: the open store of that type,
    else a ``ConfigError`` that says why (the scheduler would refuse the second registration)."""
    if getattr(store, "_closed", False):
        raise ConfigError(
            f"this process was worker {store.rank} of this job until its kvstore {store.type!r} was "
            f"closed: a process joins a job once, so kv.create({name!r}) cannot join it again "
            "(create the store once and close it at the end)"
        )
    if store.type != name:
        raise ConfigError(
            f"this process is worker {store.rank} of this job already, with kvstore {store.type!r}: "
            f"kv.create({name!r}) cannot make it a second worker (a process is one worker); use that store"
        )
    return store
