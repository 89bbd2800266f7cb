"""Shared-memory segments under /dev/shm for same-host array exchange.

A worker creates one segment per key part it exchanges with a server on its own host and
names it ``launchkit-<job id>-...`` (the launcher removes ``/dev/shm/launchkit-<job id>-*``
when a job ends, as a backstop). The worker unlinks the name as soon as the server has
mapped the segment (after the first reply), so a crash later leaves nothing behind; both
processes keep their mappings. ``close`` unlinks whatever is still named. Which peers share
this memory is decided by ``host.machine_identity``.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os

import numpy as np

from trainer_core.sharedmap import map_shared

SHM_DIR = "/dev/shm"


def job_prefix(job_id: str) -> str:
    """The name prefix of every segment of job ``job_id``."""
    return f"launchkit-{job_id}-"


class Segment:
    """One mapped segment; ``view(dtype, n)`` is a numpy view of its first ``n`` elements."""

    def __init__(self, name: str, nbytes: int, create: bool) -> None:
        self.name = name
        self.nbytes = nbytes
        self.path = os.path.join(SHM_DIR, name)
        self.named = create
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(self.path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, nbytes)
            elif os.fstat(fd).st_size < nbytes:
                raise ValueError(f"segment {name} is smaller than {nbytes} bytes")
            self._mmap: mmap.mmap | None = map_shared(fd, nbytes, f"segment {name}")
        except BaseException:
            if create:
                os.unlink(self.path)
            raise
        finally:
            os.close(fd)

    def view(self, dtype: np.dtype, n: int) -> np.ndarray:
        assert self._mmap is not None
        return np.frombuffer(self._mmap, dtype=dtype, count=n)

    def unlink(self) -> None:
        """Remove the name (mappings stay valid)."""
        if self.named:
            self.named = False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    def close(self) -> None:
        """Unmap; numpy views must be gone first (else the mapping stays until they are)."""
        self.unlink()
        if self._mmap is not None:
            with contextlib.suppress(BufferError):  # a view is still alive; the mapping goes with it
                self._mmap.close()
            self._mmap = None


class SegmentFactory:
    """Creates uniquely named segments for one node (``launchkit-<job>-<role><rank>-<pid>-<n>``)."""

    def __init__(self, job_id: str, tag: str) -> None:
        self._prefix = f"{job_prefix(job_id)}{tag}-{os.getpid()}-"
        self._counter = itertools.count()

    def create(self, nbytes: int) -> Segment:
        return Segment(f"{self._prefix}{next(self._counter)}", max(nbytes, 1), create=True)


class MemBuffer:
    """An anonymous shared-memory buffer (``memfd``): never named in /dev/shm, so nothing can leak.

    A server keeps its key values in such buffers and passes the descriptor to same-host workers
    (SCM_RIGHTS, the same-host channel ``unix.py``); they map it once and read pulled values straight from it.
    """

    _ids = itertools.count(1)

    def __init__(self, nbytes: int, fd: int | None = None, ident: int | None = None) -> None:
        self.nbytes = max(nbytes, 1)
        self.id = next(MemBuffer._ids) if ident is None else ident
        owner = fd is None
        if fd is None:
            fd = os.memfd_create(f"launchkit-kv-{self.id}", os.MFD_CLOEXEC)
            os.ftruncate(fd, self.nbytes)
        elif os.fstat(fd).st_size < self.nbytes:
            os.close(fd)
            raise ValueError("shared buffer smaller than announced")
        try:
            self._mmap: mmap.mmap | None = map_shared(fd, self.nbytes, "a key's shared buffer")
        except BaseException:
            os.close(fd)
            raise
        self.fd: int | None = fd if owner else None  # the owner keeps it to pass it on
        if not owner:
            os.close(fd)

    def view(self, dtype: np.dtype, n: int) -> np.ndarray:
        assert self._mmap is not None
        return np.frombuffer(self._mmap, dtype=dtype, count=n)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self._mmap is not None:
            with contextlib.suppress(BufferError):
                self._mmap.close()
            self._mmap = None
