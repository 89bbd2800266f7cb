"""The ``KVStore`` API every store type shares, and the key/value helpers they use."""

from __future__ import annotations

import atexit
import contextlib
import weakref
from collections.abc import Sequence
from typing import Any

import trainer_core.xp as arrays
from trainer_core.errors import KVError
from trainer_core.ps.protocol import Key

Pairs = list[tuple[Key, list[Any]]]


def normalize(keys: Key | Sequence[Key], values: Any) -> Pairs:
    """``[(key, [arrays...]), ...]`` from one key or a list of keys and matching values."""
    kind = type(keys)
    if kind is str or kind is int:  # one key (the common call): no other checks needed
        return [(keys, as_list(values, keys))]  # type: ignore[list-item, arg-type]
    if isinstance(keys, list | tuple):
        if not isinstance(values, list | tuple) or len(values) != len(keys):
            raise KVError("a list of keys needs a list of values of the same length")
        return [(check_key(k), as_list(v, k)) for k, v in zip(keys, values, strict=True)]
    return [(check_key(keys), as_list(values, keys))]  # type: ignore[arg-type]


def check_key(key: Any) -> Key:
    if isinstance(key, bool) or not isinstance(key, int | str):
        raise KVError(f"keys are ints or strings, got {key!r}")
    return key


def as_list(value: Any, key: Key | None = None) -> list[Any]:
    """``value`` as a list of arrays (one array, or a list of them: one per device). A Python
    number or list where an array belongs is a ``TypeError`` saying what is accepted."""
    if value is None:
        raise KVError("a value is missing")
    out = list(value) if isinstance(value, list | tuple) else [value]
    for v in out:
        if not (hasattr(v, "dtype") and hasattr(v, "shape")):
            raise TypeError(
                f"key {key!r}: a value is an array (numpy, or cupy on a GPU) or a list of arrays, one per "
                f"device, not {type(v).__name__} {v!r:.60}: wrap it, e.g. np.asarray(value, np.float32)"
            )
    return out


def write_out(value: Any, outs: list[Any]) -> None:
    """Copy a flat result (host, or on the device of every output) into every output array (numpy
    or cupy). A host value goes up to a cupy output of its dtype once, straight into it."""
    for out in outs:
        if out.size != value.size:
            raise KVError(f"output has {out.size} elements, the value {value.size}")
        up = arrays.is_device_array(out) and not arrays.is_device_array(value)
        if up and out.dtype == value.dtype and out.flags.c_contiguous:
            arrays.host_to_device(value, out)
        else:
            out[...] = arrays.like(value.reshape(out.shape), out)


class KVStore:
    """The API shared by every store type."""

    type: str
    rank: int = 0
    num_workers: int = 1

    def init(self, key: Key | Sequence[Key], value: Any) -> None:
        raise NotImplementedError

    def push(self, key: Key | Sequence[Key], value: Any) -> None:
        raise NotImplementedError

    def pull(self, key: Key | Sequence[Key], out: Any) -> Any:
        raise NotImplementedError

    def pushpull(self, key: Key | Sequence[Key], value: Any, out: Any = None) -> Any:
        raise NotImplementedError

    def barrier(self) -> None:
        """Wait until every worker reached the barrier (no-op in one process)."""

    def initialized(self, key: Key) -> bool:
        """Whether ``key`` was initialized through this store (a key is initialized once)."""
        return False

    def agree(self, at: str, value: Any) -> Any:
        """Collective: the job-wide setting ``at`` that every worker gives as ``value`` (plain data);
        returned when they agree, else ``KVError`` on every worker naming each value (one process:
        ``value``)."""
        return value

    def set_optimizer(self, optimizer: Any, **kwargs: Any) -> None:
        raise NotImplementedError

    def set_gradient_compression(self, params: Any) -> None:
        raise NotImplementedError

    def server_state(self) -> dict[Key, dict[str, Any]]:
        """The servers' per-key state (value, optimizer state, pull residuals), for checkpoints."""
        raise NotImplementedError

    def load_server_state(self, state: dict[Key, dict[str, Any]]) -> None:
        """Restore ``server_state()``."""
        raise NotImplementedError

    def close(self) -> None:
        """End this store (a worker waits for every other worker, as MXNet's finalize)."""

    def __enter__(self) -> KVStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_OPEN: weakref.WeakSet[KVStore] = weakref.WeakSet()


@atexit.register
def _close_open_stores() -> None:
    for store in list(_OPEN):
        with contextlib.suppress(Exception):  # already logged; the process is ending
            store.close()
