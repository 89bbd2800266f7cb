"""What a node reads from its environment: the launcher contract plus the ps-lite knobs (pure)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from dmlc_env import NodeEnv
from trainer_core.errors import ConfigError

# ps-lite's knobs, read here only (a user sets them; launchers pass them through)
PS_VERBOSE = "PS_VERBOSE"
PS_HEARTBEAT_INTERVAL = "PS_HEARTBEAT_INTERVAL"
PS_HEARTBEAT_TIMEOUT = "PS_HEARTBEAT_TIMEOUT"
MXNET_KVSTORE_BIGARRAY_BOUND = "MXNET_KVSTORE_BIGARRAY_BOUND"
# trainer_core's own knobs (documented in docs/kvstore.md)
PS_START_TIMEOUT = "PS_START_TIMEOUT"  # seconds to wait for every node to register
PS_SHM = "PS_SHM"  # 0: no shared memory between processes of one host
PS_ENCRYPT = "PS_ENCRYPT"  # 1: CURVE-encrypt array data across hosts too
TRAINER_CORE_AUTOSTART = "TRAINER_CORE_AUTOSTART"  # 0: importing trainer_core does not run the role
# a wait for a live peer (docs/collectives.md, "Slow is not dead"): warn every N s (0: never) ...
TRAINER_CORE_STALL_CHECK_SECONDS = "TRAINER_CORE_STALL_CHECK_SECONDS"
# ... and give up after N s (0: never, the default: a live peer is waited for)
TRAINER_CORE_STALL_SHUTDOWN_SECONDS = "TRAINER_CORE_STALL_SHUTDOWN_SECONDS"


DEFAULT_HEARTBEAT_INTERVAL = 1.0
DEFAULT_HEARTBEAT_TIMEOUT = 10.0
DEFAULT_START_TIMEOUT = 300.0
DEFAULT_BIGARRAY_BOUND = 1_000_000
DEFAULT_STALL_CHECK = 60.0


@dataclass(frozen=True)
class StallPolicy:
    """How a wait for a peer that is alive (its heartbeats arrive) treats time: a warning after
    ``check_s`` seconds and again every ``check_s`` (0: none), and, only when ``shutdown_s`` is
    set (0: never, the default), giving up after that many seconds. A peer that died or stopped
    is not a stall: the job's liveness ends every wait for it (the heartbeat timeout)."""

    check_s: float = DEFAULT_STALL_CHECK
    shutdown_s: float = 0.0

    def warnings_due(self, waited_s: float) -> int:
        """How many warnings a wait of ``waited_s`` seconds has given by now."""
        return int(waited_s // self.check_s) if self.check_s > 0 else 0

    def gives_up(self, waited_s: float) -> bool:
        """Whether a wait of ``waited_s`` seconds ends now (only with ``shutdown_s`` set)."""
        return 0 < self.shutdown_s <= waited_s

    def replace(self, check_s: float | None = None, shutdown_s: float | None = None) -> StallPolicy:
        """This policy with the settings given (an API's arguments over the environment's)."""
        return StallPolicy(
            self.check_s if check_s is None else _non_negative("stall_check_s", check_s),
            self.shutdown_s if shutdown_s is None else _non_negative("stall_shutdown_s", shutdown_s),
        )

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> StallPolicy:
        e = os.environ if environ is None else environ
        return cls(
            _float(e, TRAINER_CORE_STALL_CHECK_SECONDS, DEFAULT_STALL_CHECK),
            _float(e, TRAINER_CORE_STALL_SHUTDOWN_SECONDS, 0.0),
        )


@dataclass(frozen=True)
class NodeConfig:
    """Everything a scheduler, server or worker needs to join a job."""

    env: NodeEnv
    secret: str
    job_id: str
    heartbeat_interval: float
    heartbeat_timeout: float
    start_timeout: float
    bigarray_bound: int
    verbose: int
    use_shm: bool
    encrypt: bool = False  # CURVE on the data channel across hosts too (PS_ENCRYPT=1)
    stall: StallPolicy = StallPolicy()  # waits for live peers (TRAINER_CORE_STALL_*)

    @property
    def role(self) -> str:
        return self.env.role

    @property
    def liveness_on(self) -> bool:
        return self.heartbeat_interval > 0 and self.heartbeat_timeout > 0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None, role: str | None = None) -> NodeConfig:
        """Read and validate the environment; ``role`` overrides ``DMLC_ROLE`` (``python -m`` entry points)."""
        given = os.environ if environ is None else environ
        e = dict(given)
        if role is not None:
            e["DMLC_ROLE"] = role
        try:
            env = NodeEnv.from_environ(e)
        except (KeyError, ValueError) as exc:
            said = str(exc).strip("'\"")
            if not any(name.startswith("DMLC_") for name in given):  # `python train.py`, no launcher
                said += (
                    " (no DMLC_* variable is set: this process was not started by `launchkit launch`, "
                    "which sets them; e.g. `launchkit launch -n 2 python SCRIPT`)"
                )
            raise ConfigError(said) from None
        if env.secret is None:
            raise ConfigError(
                "environment variable LAUNCHKIT_JOB_SECRET is not set: every connection of the KV store "
                "is authenticated with it (launchkit sets it; set any random string when starting nodes by hand)"
            )
        if env.num_workers < 1:
            raise ConfigError(f"DMLC_NUM_WORKER={env.num_workers}: a job needs at least 1 worker")
        if env.num_servers < 0:
            raise ConfigError(
                f"DMLC_NUM_SERVER={env.num_servers}: expected 0 (workers only, no parameter server) or more"
            )
        interval = _float(e, PS_HEARTBEAT_INTERVAL, DEFAULT_HEARTBEAT_INTERVAL)
        timeout = _float(e, PS_HEARTBEAT_TIMEOUT, DEFAULT_HEARTBEAT_TIMEOUT)
        if interval > 0 and timeout > 0 and timeout < 2 * interval:
            raise ConfigError(
                f"{PS_HEARTBEAT_TIMEOUT}={timeout} must be at least twice {PS_HEARTBEAT_INTERVAL}"
            )
        return cls(
            env=env,
            secret=env.secret,
            job_id=env.job_id or "nojob",
            heartbeat_interval=interval,
            heartbeat_timeout=timeout,
            start_timeout=_float(e, PS_START_TIMEOUT, DEFAULT_START_TIMEOUT),
            bigarray_bound=int(_float(e, MXNET_KVSTORE_BIGARRAY_BOUND, DEFAULT_BIGARRAY_BOUND)),
            verbose=int(_float(e, PS_VERBOSE, 0)),
            use_shm=e.get(PS_SHM, "1") not in ("0", "false", "no"),
            encrypt=e.get(PS_ENCRYPT, "0") not in ("0", "false", "no", ""),
            stall=StallPolicy.from_environ(e),
        )


def _float(e: Mapping[str, str], name: str, default: float) -> float:
    raw = e.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r}: expected a number") from None
    if value < 0:
        raise ConfigError(f"environment variable {name}={raw!r}: must not be negative")
    return value


def _non_negative(name: str, value: float) -> float:
    if not value >= 0:
        raise ConfigError(f"{name}={value!r}: expected seconds, 0 or more")
    return float(value)
