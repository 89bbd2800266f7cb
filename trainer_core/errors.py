"""Structured exceptions of the trainer core's KV store."""

from __future__ import annotations


class KVError(RuntimeError):
    """Base class: something went wrong in the KV store."""


class ConfigError(KVError):
    """The environment or an argument is invalid (names the variable or argument)."""


class WireError(KVError):
    """A received message does not follow docs/wire.md (it is dropped, never executed)."""


class NodeFailure(KVError):
    """Another node of the job died or stopped answering; the job is over.

    ``node`` names the node (``worker 1``, ``server 0``, ``scheduler``) when known.
    """

    def __init__(self, message: str, node: str | None = None) -> None:
        super().__init__(message)
        self.node = node


class MembershipChanged(KVError):
    """The workers of an elastic job changed while an operation was in flight (Horovod's
    ``HorovodInternalError`` in spirit): the operation failed on every survivor; the job goes on
    at the new ``epoch``, where the group is formed again. ``node`` names a worker that left or
    joined; ``left`` and ``joined`` name them all (since the epoch the operation began in)."""

    def __init__(
        self, message: str, epoch: int, left: tuple[str, ...] = (), joined: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message)
        self.epoch = epoch
        self.left = left
        self.joined = joined
        self.node = (left + joined)[0] if left or joined else None


class StartupTimeout(KVError):
    """The job did not assemble (not every node registered) within ``PS_START_TIMEOUT``."""


class CompressionError(KVError):
    """Unsupported or invalid gradient-compression parameters."""


class OptimizerError(KVError):
    """Unsupported or invalid server-side optimizer spec."""
