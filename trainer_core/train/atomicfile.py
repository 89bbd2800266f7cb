"""One file written whole or not at all (checkpoints): a temporary file in the target's
directory, flushed and fsynced, then ``os.replace``; a reader sees the old file or the new one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def write_atomic(target: Path, write: Callable[[BinaryIO], None], tmp: Path | None = None) -> Path:
    """Write ``target`` with ``write(file)`` through a temporary file in its directory (``tmp``, by
    default a fresh name), flushed and fsynced, then ``os.replace``; the directory is made if it is
    missing. An ``OSError`` (a read-only or full disk) names the checkpoint and its cause; removing
    the temporary file after a failure never hides that error with its own."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if tmp is None:
            fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            tmp, f = Path(name), os.fdopen(fd, "wb")
        else:
            f = open(tmp, "wb")  # noqa: SIM115 (closed by the with below)
    except OSError as exc:
        raise write_error(target, exc) from exc
    try:
        with f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):  # the write's own error is the one to report
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise write_error(target, exc) from exc
        raise
    return target


def write_error(target: Path, exc: OSError) -> OSError:
    """``exc`` (same class and errno) as a message that names the checkpoint being written."""
    where = f" ({exc.filename})" if exc.filename else ""
    return type(exc)(exc.errno, f"cannot write the checkpoint {target}: {exc.strerror or exc}{where}")
