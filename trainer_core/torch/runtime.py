"""``init()``: which path this process reduces over, chosen from the launcher's environment.

* no ``DMLC_ROLE`` (the script runs as plain ``python``): one rank, nothing moves (``Solo``);
* ``DMLC_ROLE=scheduler`` or ``server``: this process serves that role and exits when the job ends,
  as ``import trainer_core`` and ``kv.create`` do (a job's every process runs the same script);
* ``DMLC_ROLE=worker``: without servers (``-s 0``) the workers' collective group
  (``comm="allreduce"``: ``trainer_core.collective.group()``), with servers the KV store
  (``comm="ps"``: ``kv.create("dist_sync")``). ``init(path=...)`` asks for one; a path the job
  cannot give is a clear error. ``comm="allreduce"`` in a job with servers: the collectives among
  the workers carry the allreduce operations and the KV store is open beside them, both over the
  worker's one registration (``train.joint.Joint``; ``kv.create("dist_sync")`` returns that store).

``HOROVOD_FUSION_THRESHOLD`` and ``HOROVOD_CYCLE_TIME`` are read here (``fusion``: Horovod's
tensor fusion on the collectives' path, and the optimizer's bucket size).

``init(stall_check_s=..., stall_shutdown_s=...)`` sets how a wait for a live but late rank (or
sync round) warns and whether it gives up (over ``TRAINER_CORE_STALL_*``; docs/collectives.md,
"Slow is not dead"), on either path.

The state lives in a ``Runtime`` (``default`` serves the Horovod-style module functions; every
function also takes ``runtime=`` so that a test may hold several).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping

import trainer_core.collective as collective
from trainer_core.config import (
    TRAINER_CORE_STALL_CHECK_SECONDS,
    TRAINER_CORE_STALL_SHUTDOWN_SECONDS,
    StallPolicy,
)
from trainer_core.errors import ConfigError

from . import fusion_settings
from .backend import KV, Backend, Collective, Solo

COMMS = ("allreduce", "ps")


def choose(environ: Mapping[str, str], comm: str | None) -> str:
    """``"solo"``, ``"allreduce"`` or ``"ps"`` for a worker's environment; ConfigError when the
    job cannot give ``comm``."""
    if comm is not None and comm not in COMMS:
        raise ConfigError(f"init's path must be 'allreduce' or 'ps', not {comm!r}")
    if environ.get("DMLC_ROLE") is None:
        return "solo"
    raw = environ.get("DMLC_NUM_SERVER", "0")
    try:
        servers = int(raw)
    except ValueError:
        raise ConfigError(f"DMLC_NUM_SERVER must be a number, not {raw!r}") from None
    if comm is None:
        return "ps" if servers > 0 else "allreduce"
    if comm == "ps" and servers == 0:
        raise ConfigError(
            "path='ps' needs parameter servers: launch with -s 1 or more (or use path='allreduce')"
        )
    return comm


def num_servers(environ: Mapping[str, str]) -> int:
    """The job's number of parameter servers (``choose`` has read it)."""
    return int(environ.get("DMLC_NUM_SERVER", "0"))


class Runtime:
    """One process's trainer_core.torch state: the backend ``init`` made."""

    def __init__(self) -> None:
        self._backend: Backend | None = None
        self._lock = threading.Lock()
        #: process sets may be added and removed after init (``init(process_sets="dynamic")``)
        self.dynamic_sets = False

    def init(
        self,
        comm: str | None = None,
        environ: Mapping[str, str] | None = None,
        stall_check_s: float | None = None,
        stall_shutdown_s: float | None = None,
    ) -> Backend:
        """Join the job (once; later calls return the same backend); ``stall_check_s`` and
        ``stall_shutdown_s`` override ``TRAINER_CORE_STALL_CHECK_SECONDS`` and ``..._SHUTDOWN_SECONDS``."""
        env = os.environ if environ is None else environ
        own = environ is None  # this process's environment: the default group is the one joined
        if stall_check_s is not None or stall_shutdown_s is not None:
            stall = StallPolicy.from_environ(env).replace(stall_check_s, stall_shutdown_s)
            environ = env = {
                **env,
                TRAINER_CORE_STALL_CHECK_SECONDS: repr(stall.check_s),
                TRAINER_CORE_STALL_SHUTDOWN_SECONDS: repr(stall.shutdown_s),
            }
        fusing = fusion_settings.from_environ(env)  # (HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME)
        role = env.get("DMLC_ROLE")
        if role in ("scheduler", "server"):
            from trainer_core.ps.roles import run_role_and_exit

            run_role_and_exit(role, env)
        if role not in (None, "worker"):
            raise ConfigError(f"DMLC_ROLE must be worker, server or scheduler, not {role!r}")
        with self._lock:
            if self._backend is not None:
                if comm is not None and comm != self._backend.comm:
                    raise ConfigError(
                        f"trainer_core.torch is already initialized with path={self._backend.comm!r}"
                    )
                return self._backend
            path = choose(env, comm)
            if path == "solo":
                self._backend = Solo()
            elif path == "allreduce" and num_servers(env) > 0:
                from trainer_core.train.joint import Joint

                both = Joint.join(environ)  # one registration: the group and the KV store on it
                if own:  # collective's module functions (and kv.create) use them too
                    collective.default.set(both.group)
                self._backend = Collective(both.group, kv=both.kv)
            elif path == "allreduce":
                if environ is None:
                    group = collective.group()
                else:
                    group = collective.join(environ)
                    if own:  # with the stall arguments: collective's module functions use it too
                        collective.default.set(group)
                self._backend = Collective(group)
            else:
                import trainer_core.kv as kv

                self._backend = KV(kv.create("dist_sync", None if environ is None else dict(environ)))
            self._backend.fuse(fusing)
            return self._backend

    def attach(self, backend: Backend) -> Backend:
        """Use ``backend`` (made otherwise: e.g. a ``Collective`` over an in-process group in a test)."""
        with self._lock:
            if self._backend is not None:
                raise ConfigError("trainer_core.torch is already initialized")
            self._backend = backend
            return backend

    def backend(self) -> Backend:
        b = self._backend
        if b is None:
            raise ValueError(
                "trainer_core.torch has not been initialized; call trainer_core.torch.init() first"
            )
        return b

    def initialized(self) -> bool:
        return self._backend is not None

    def reform(self) -> Backend:
        """After an elastic job's workers changed: the backend over the group of the new epoch
        (this process stays in the job; ``reform`` of a path without one leaves and joins again)."""
        with self._lock:
            b = self._backend
        if b is None:
            raise ValueError(
                "trainer_core.torch has not been initialized; call trainer_core.torch.init() first"
            )
        remake = getattr(b, "reform", None)
        if not callable(remake):
            comm = b.comm
            self.shutdown()
            return self.init(None if comm == "solo" else comm)
        new = remake()
        with self._lock:
            self._backend = new
        if isinstance(b, Collective):  # the default group follows
            old = collective.default.set(None)
            collective.default.set(new.group if old is b.group else old)
        return new

    def shutdown(self) -> None:
        """Leave the job (every worker, at the end); ``init`` may join again."""
        with self._lock:
            b, self._backend = self._backend, None
        if isinstance(b, Collective):  # forget the default group if it is this one
            old = collective.default.set(None)
            if old is not None and old is not b.group:
                collective.default.set(old)
        if b is not None:
            b.close()


#: the process's runtime (a convenience for Horovod's module functions)
default = Runtime()
