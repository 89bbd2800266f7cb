"""Waiting on a 32-bit word of shared memory without burning a core: Linux's ``futex`` (wait and
wake), called through ``ctypes`` on the word's address in a ``MAP_SHARED`` mapping, so that it
works between processes. Where the call is not available (another OS or architecture), ``wait``
sleeps for a short while instead: slower to wake, never wrong, since every waiter re-reads the word.
"""

from __future__ import annotations

import ctypes
import platform
import sys
import time

_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
_WAKE_ALL = 0x7FFFFFFF


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux") or _SYS_FUTEX is None:
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _libc()


def available() -> bool:
    return _LIBC is not None


def wait(address: int, expected: int, timeout_s: float) -> None:
    """Sleep while the uint32 at ``address`` holds ``expected``, at most ``timeout_s`` seconds
    (it may return early, spuriously: the caller re-reads the word)."""
    if _LIBC is None:
        time.sleep(min(timeout_s, 0.0002))
        return
    ts = _Timespec(int(timeout_s), int((timeout_s % 1.0) * 1e9))
    _LIBC.syscall(
        _SYS_FUTEX,
        ctypes.c_void_p(address),
        _FUTEX_WAIT,
        ctypes.c_uint32(expected),
        ctypes.byref(ts),
        None,
        0,
    )


def wake(address: int) -> None:
    """Wake every process sleeping in ``wait`` on the word at ``address``."""
    if _LIBC is not None:
        _LIBC.syscall(
            ctypes.c_long(_SYS_FUTEX or 0),
            ctypes.c_void_p(address),
            ctypes.c_int(_FUTEX_WAKE),
            ctypes.c_int(_WAKE_ALL),
            None,
            None,
            ctypes.c_int(0),
        )
