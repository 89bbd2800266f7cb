"""Every process's output, kept by the launcher beside the job record, for ``launchkit logs``.

``$LAUNCHKIT_HOME/jobs/<job_id>/<role>-<rank>.stdout`` (and ``.stderr``): the raw bytes of each
stream, written by the output merger whether or not ``--log-dir`` is given. Each file is capped:
past ``CAP`` bytes it becomes ``<name>.1`` (replacing the one before) and a new file starts, so
a stream keeps between ``CAP`` and twice ``CAP`` of its latest output. The merger flushes the files
at least every ``launchkit.merger.FLUSH_EVERY`` seconds, so ``launchkit logs`` stays within a second
of the console, and a launcher killed outright loses at most that much. Unlike ``--log-dir``
(whose failure is exit 74), a failure to write here is a warning, once, and never fails the job.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from launchkit.jobs.live import job_dir

CAP = 8 << 20  # bytes per file before it is rotated
BUFFER = 1 << 16
_NAME = re.compile(r"^(?P<role>[a-z]+)-(?P<rank>\d+)\.(?P<stream>stdout|stderr)$")


class Keeper:
    """Opens the kept output files of one job; the first failure is reported once through
    ``warn``, and from then on nothing more is kept."""

    def __init__(self, job_id: str, warn: Callable[[str], None], cap: int = CAP) -> None:
        self.dir = job_dir(job_id)
        self.warn = warn
        self.cap = cap
        self.failed = False
        self._made = False  # the directory exists (made once, not once a stream)

    def fail(self, exc: OSError) -> None:
        if not self.failed:
            self.failed = True
            self.warn(
                f"cannot keep the job's output in {self.dir}: {exc.strerror or exc}; the job goes on "
                "(launchkit logs will lack what follows)"
            )

    def open(self, role: str, rank: int, stream: str) -> KeptFile | None:
        if self.failed:
            return None
        try:
            if not self._made:
                self.dir.mkdir(parents=True, exist_ok=True)
                self._made = True
        except OSError as exc:
            self.fail(exc)
            return None
        return KeptFile(self, self.dir / f"{role}-{rank}.{'stdout' if stream == 'out' else 'stderr'}")


class KeptFile:
    """One stream's file: ``write``, ``flush``, ``create`` and ``close`` never raise. The file is
    created by the first of them (``create``: the output merger's, when it has nothing to read),
    not when the process starts: 2048 files created one after the other, with the other work of
    a start, were 1.1 s of the launcher's start of 1024 processes (bench/scale_profile.py)."""

    def __init__(self, keeper: Keeper, path: Path) -> None:
        self.keeper = keeper
        self.path = path
        self.f: IO[bytes] | None = None
        self.size = 0
        self.closed = False

    def create(self) -> bool:
        """The file exists (created now if it was not, empty); False once closed or failed."""
        if self.f is None and not self.closed and not self.keeper.failed:
            try:
                self.f = open(self.path, "ab", buffering=BUFFER)  # noqa: SIM115 (held open)
                self.size = os.fstat(self.f.fileno()).st_size
            except OSError as exc:
                self.keeper.fail(exc)
        return self.f is not None

    def write(self, data: bytes) -> None:
        if self.keeper.failed or not self.create() or self.f is None:
            return
        try:
            self.f.write(data)
            self.size += len(data)
            if self.size >= self.keeper.cap:
                self.f.close()
                os.replace(self.path, self.path.with_name(self.path.name + ".1"))
                self.f = open(self.path, "ab", buffering=BUFFER)  # noqa: SIM115
                self.size = 0
        except OSError as exc:
            self.keeper.fail(exc)
            self.close()

    def flush(self) -> None:
        if self.f is not None and not self.keeper.failed:
            try:
                self.f.flush()
            except OSError as exc:
                self.keeper.fail(exc)

    def close(self) -> None:
        self.create()  # a stream that said nothing still has its (empty) file, as before
        self.closed = True
        f, self.f = self.f, None
        if f is not None:
            try:
                f.close()
            except OSError as exc:
                self.keeper.fail(exc)


@dataclass(frozen=True)
class Kept:
    """One kept stream: its files, oldest first (a rotated ``.1`` before the current one)."""

    role: str
    rank: int
    stream: str  # stdout, stderr
    paths: tuple[Path, ...]


_ROLE_ORDER = {"scheduler": 0, "server": 1, "worker": 2}


def kept(job_id: str) -> list[Kept]:
    """The job's kept streams: scheduler, servers, workers by rank, stdout before stderr."""
    found = []
    with contextlib.suppress(OSError):
        for p in job_dir(job_id).iterdir():
            m = _NAME.match(p.name)
            if m:
                older = p.with_name(p.name + ".1")
                paths = (older, p) if older.exists() else (p,)
                found.append(Kept(m["role"], int(m["rank"]), m["stream"], paths))
    return sorted(found, key=lambda k: (_ROLE_ORDER.get(k.role, 3), k.role, k.rank, k.stream != "stdout"))


def last_lines(paths: tuple[Path, ...], n: int | None) -> list[str]:
    """The lines of ``paths`` in turn (the last ``n`` when given), decoded leniently."""
    lines: deque[str] | list[str] = deque(maxlen=n) if n is not None else []
    for p in paths:
        with contextlib.suppress(FileNotFoundError), open(p, "rb") as f:
            for raw in f:
                lines.append(raw.decode(errors="replace").rstrip("\r\n"))
    return list(lines)


def follow(path: Path, start: int) -> Iterator[list[str]]:
    """The complete lines written to ``path`` past byte ``start``, one list per call. A rotation
    between two calls loses nothing: the rest of the old file (now ``<name>.1``) comes first, and
    a line the rotation cut (files are capped by bytes) is joined again. Only a file rotated twice
    between two calls (``CAP`` bytes in between) leaves a gap."""
    older = path.with_name(path.name + ".1")
    offset, inode, pending = start, None, b""
    while True:
        data = b""
        with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if inode is not None and st.st_ino != inode:  # rotated: the old file is now .1
                data = _rest(older, inode, offset)
                offset = 0
            inode = st.st_ino
            f.seek(offset)
            new = f.read()
            offset += len(new)
            data += new
        data = pending + data
        cut = data.rfind(b"\n")
        pending = data[cut + 1 :]
        yield [x.decode(errors="replace").rstrip("\r") for x in data[:cut].split(b"\n")] if cut >= 0 else []


def _rest(path: Path, inode: int, offset: int) -> bytes:
    """What ``path`` holds past ``offset``, if it is still the file ``inode``."""
    with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
        if os.fstat(f.fileno()).st_ino == inode:
            f.seek(offset)
            return f.read()
    return b""
