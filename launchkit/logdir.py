"""``--log-dir``: checked before anything starts, and written by one running launch at a time.

``check_log_dir`` creates the directory and writes a byte there, so that one that cannot be
written (not a directory, read-only, full, not ours) stops the launch (exit 2), saying which and
why. ``hold_log_dir`` also takes the directory for the job: two launches at once with the same
``--log-dir`` would append into the same ``ROLE-RANK.stdout`` files, their lines mixed; the
second is refused (exit 2), naming the process that holds it. The hold is an ``flock`` on the
directory itself (nothing is left in it), which the kernel lets go when the launcher ends, however
it ends.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import tempfile
from pathlib import Path

from launchkit.errors import UsageError

_KINDS = (
    (stat.S_ISREG, "a file"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symbolic link to nothing"),
)


def _not_a_directory(log_dir: Path) -> str | None:
    """``log_dir`` or the first of its parents that is there but is no directory, said as what it
    is (``/dev/null is a character device``); None when there is none."""
    for path in (log_dir, *log_dir.parents):
        try:
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                mode = path.stat().st_mode
        except (FileNotFoundError, NotADirectoryError):
            if not stat.S_ISLNK(mode := _lmode(path)):
                continue  # not there (mkdir makes it), or in the path of a file further up
        except OSError:
            return None  # not ours to read: the write says why
        if stat.S_ISDIR(mode):
            return None
        what = next((name for test, name in _KINDS if test(mode)), "not a directory")
        inside = "" if path == log_dir else f" (in the path of {log_dir})"
        return f"{path} is {what}{inside}, not a directory"
    return None


def _lmode(path: Path) -> int:
    """The mode of ``path`` itself (a link, not what it points to); 0 when it is not there."""
    try:
        return path.lstat().st_mode
    except OSError:
        return 0


def check_log_dir(log_dir: Path) -> None:
    """Create ``--log-dir`` and write a byte there, so that a directory we cannot write to (not a
    directory, read-only, full, not ours) stops the launch before anything starts (exit 2),
    naming it."""
    why = _not_a_directory(log_dir)
    if why is not None:
        raise UsageError(f"--log-dir {log_dir}: {why}")
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=log_dir, prefix=".launchkit-probe-") as probe:
            probe.write(b"x")
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as exc:
        # a directory that is there but takes no new file (/proc/1) says ENOENT
        odd = " (that directory takes no new file)" if exc.errno == errno.ENOENT and log_dir.is_dir() else ""
        raise UsageError(f"--log-dir {log_dir}: cannot write there: {exc.strerror or exc}{odd}") from None


class Hold:
    """A ``--log-dir`` taken for one job, until ``release`` (or the launcher's end)."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def hold_log_dir(log_dir: Path) -> Hold:
    """``check_log_dir``, then take the directory for this launch until the hold's ``release``;
    UsageError (exit 2) when another running launch holds it."""
    check_log_dir(log_dir)
    try:
        fd = os.open(log_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(f"--log-dir {log_dir}: cannot open it: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = holder_pid(os.fstat(fd))
        os.close(fd)
        by = f"another launch (pid {holder})" if holder else "another launch"
        raise UsageError(
            f"--log-dir {log_dir} is in use by {by}, still running: both jobs would append to the same "
            "ROLE-RANK.stdout and .stderr files there; give another --log-dir, or wait for that job to end"
        ) from None
    except OSError:  # a file system without locks: nothing to hold, nothing to refuse
        pass
    return Hold(fd)


def holder_pid(st: os.stat_result, locks: str | None = None) -> int | None:
    """The process that holds an ``flock`` on the file ``st`` is of, as ``/proc/locks`` (or
    ``locks``, its text) says: ``1: FLOCK  ADVISORY  WRITE 4242 fe:00:2188115 0 EOF``."""
    if locks is None:
        try:
            with open("/proc/locks") as f:
                locks = f.read()
        except OSError:
            return None
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in locks.splitlines():
        words = line.split()
        if len(words) >= 6 and words[1] == "FLOCK" and words[5] == dev and words[4].isdigit():
            return int(words[4])
    return None
