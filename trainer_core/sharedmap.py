"""Mapping shared memory with an error that says what did not fit: a base module (standard
library only) that the transport's segments and the collectives' host segments both use."""

from __future__ import annotations

import errno
import mmap
import resource

__all__ = ["map_shared", "no_room"]


def map_shared(fd: int, nbytes: int, what: str, offset: int = 0) -> mmap.mmap:
    """``mmap(fd, nbytes, offset)``; a mapping the process cannot take (``ENOMEM``: its
    address-space limit, or the machine's memory) is a ``MemoryError`` naming the size, ``what``
    it is for, the limit, and what to do."""
    try:
        return mmap.mmap(fd, nbytes, offset=offset)
    except OSError as exc:
        if exc.errno != errno.ENOMEM:
            raise
        raise MemoryError(no_room(nbytes, what)) from exc


def no_room(nbytes: int, what: str) -> str:
    """The message for a shared mapping of ``nbytes`` that did not fit."""
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    limit = "unlimited" if soft == resource.RLIM_INFINITY else f"{soft / 2**30:.2f} GiB"
    return (
        f"cannot map {nbytes / 2**30:.2f} GiB ({nbytes} bytes) of shared memory for {what}: "
        f"out of memory (this process's address-space limit, ulimit -v, is {limit}, and shared "
        "mappings count against it); raise that limit, or exchange smaller arrays per call"
    )
