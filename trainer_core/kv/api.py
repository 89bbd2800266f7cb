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
        return [(keys, as_list(keys, values))]  # type: ignore[list-item,arg-type]
    if isinstance(keys, list | tuple):
        if not isinstance(values, list | tuple) or len(values) != len(keys):
            raise KVError(
                f"keys {keys!r} are taken as a list of {len(keys)} keys, which needs a list of "
                f"{len(keys)} values (one per key), got {_describe(values)}; a key is one int or string"
            )
        return [(check_key(k), as_list(k, v)) for k, v in zip(keys, values, strict=True)]
    key = check_key(keys)
    return [(key, as_list(key, values))]


def _describe(values: Any) -> str:
    """What was given as the values of a list of keys, for an error message."""
    if isinstance(values, list | tuple):
        return f"a {type(values).__name__} of {len(values)}"
    shape = getattr(values, "shape", None)
    return f"one {type(values).__name__}" + ("" if shape is None else f" of shape {tuple(shape)}")


def check_key(key: Any) -> Key:
    if isinstance(key, bool) or not isinstance(key, int | str):
        raise KVError(f"keys are ints or strings, got {key!r}")
    return key


def as_list(key: Key, value: Any) -> list[Any]:
    """``value`` as a list of arrays (one array, or a list of them: one per device). A Python
    number or list where an array belongs is a ``ValueTypeError`` (a ``TypeError`` and a
    ``KVError``) saying what is accepted: ``init("w", [1, 2, 3])`` once held 1 element, the first."""
    if value is None:
        raise KVError(f"key {key!r}: its value is missing (None)")
    out = list(value) if isinstance(value, list | tuple) else [value]
    odd = next((v for v in out if not (hasattr(v, "dtype") and hasattr(v, "shape"))), None)
    if odd is not None or not out:
        what = f"{type(odd).__name__} {odd!r:.40}" if out else "an empty list"
        if out and isinstance(value, list | tuple):
            what = f"a {type(value).__name__} holding {what}"
        raise ValueTypeError(
            f"key {key!r}: a value is an array (numpy, or cupy on a GPU) or a list of arrays, one per "
            f"device, not {what}; numpy.asarray(value, numpy.float32) makes one array of numbers"
        )
    return out


class ValueTypeError(KVError, TypeError):
    """A value that is not an array nor a list of arrays (a Python number or list)."""


def write_out(key: Key, value: Any, outs: list[Any]) -> None:
    """Copy key ``key``'s flat result (host, or on the device of every output) into every output
    array (numpy or cupy). A host value goes up to a cupy output of its dtype once, straight into it."""
    for out in outs:
        check_out(key, out)
        if out.size != value.size:
            raise KVError(
                f"key {key!r}: the output has {out.size} elements (shape {tuple(out.shape)}), "
                f"the key's value {value.size}: pull into an array of the key's size"
            )
        up = arrays.is_device_array(out) and not arrays.is_device_array(value)
        if up and out.dtype == value.dtype and out.flags.c_contiguous:
            arrays.host_to_device(value, out)
        else:
            out[...] = arrays.like(value.reshape(out.shape), out)


def check_out(key: Key, out: Any) -> None:
    """An output of a pull is a writable array (numpy or cupy): a list of floats, a scalar or a
    read-only view was an AttributeError on ``size`` or numpy's "assignment destination is
    read-only", naming no key."""
    if not all(hasattr(out, name) for name in ("size", "shape", "dtype", "flags")):
        raise KVError(
            f"key {key!r}: out= takes an array (numpy or cupy) of the key's size, or a list of "
            f"such arrays; got {type(out).__name__} {out!r:.60}"
        )
    if not getattr(out.flags, "writeable", True):  # cupy's flags have no writeable
        raise KVError(f"key {key!r}: out= is a read-only array: pull into one it can write")


class KVStore:
    """The API shared by every store type."""

    type: str

    @property
    def rank(self) -> int:
        """This worker's rank (0 in one process)."""
        return 0

    @property
    def num_workers(self) -> int:
        """The job's workers (1 in one process)."""
        return 1

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
