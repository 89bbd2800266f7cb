"""Where ``--sync-dst-dir`` may write. Pure.

rsync puts the working directory's files into the destination on every host, and ``-a`` gives
the destination the source's mode and times: into ``/``, a top-level system directory
(``/usr``, ``/etc``, ...) or a home directory itself, that mixes the job's files among the
system's or the user's own (and changes the directory's mode and mtime). Such a destination is
refused unless the user insists (``--sync-dst-dir-force``). Paths are compared after a lexical
normalization (``/usr/``, ``/usr/.``, ``//usr``, ``/./usr`` and ``/home/../usr`` are ``/usr``),
as the host would resolve them without symlinks.

A destination that does not start with ``/`` is on the remote side of rsync, relative to the
login directory, which is the remote user's home; ``~`` and ``~user`` at its start are expanded
there too. So ``.``, ``~``, ``~/`` and ``$HOME`` (which older rsyncs let the remote shell expand)
are the remote home itself, and ``..`` or ``~/..`` are above it.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable

from launchkit.errors import UsageError

#: the flag that insists on a destination ``refusal`` names
FORCE_FLAG = "--sync-dst-dir-force"

#: top-level directories of the system (and ``/lib*``: ``/lib``, ``/lib32``, ``/lib64``, ``/libx32``)
SYSTEM_DIRS = frozenset(
    [
        "/",
        "/bin",
        "/boot",
        "/dev",
        "/etc",
        "/home",
        "/opt",
        "/proc",
        "/root",
        "/run",
        "/sbin",
        "/srv",
        "/sys",
        "/tmp",
        "/usr",
        "/var",
    ]
)
_LIB = re.compile(r"/lib[^/]*")
_HOME_VARS = ("$HOME", "${HOME}")  # the remote home, when a shell expands it


def normalize(dst: str) -> str:
    """``dst`` with ``.``, ``..``, repeated and trailing slashes resolved, lexically: an absolute
    path stays absolute (``//`` and ``/..`` are ``/``); ``~``, ``~user``, ``$HOME`` and ``${HOME}``
    at the start stay as the anchor (``$HOME`` becomes ``~``: ``~/x/..`` is ``~``, ``~/..`` is
    ``~/..``); a relative path stays relative (``x/..`` is ``.``)."""
    if dst.startswith("/"):
        return "/" + posixpath.normpath(dst).lstrip("/")
    head, _, rest = dst.partition("/")
    if head.startswith("~") or head in _HOME_VARS:
        anchor = "~" if head in _HOME_VARS else head
        rel = posixpath.normpath(rest.lstrip("/")) if rest.strip("/") else "."
        return anchor if rel == "." else f"{anchor}/{rel}"
    return posixpath.normpath(dst) if dst else "."


def _above(rel: str) -> bool:
    """Whether a normalized relative path only climbs (``..``, ``../..``)."""
    return all(part == ".." for part in rel.split("/"))


def refusal(dst: str, homes: Iterable[str] = ()) -> str | None:
    """Why rsyncing into ``dst`` would mix the job's files among the system's or a user's own,
    or None when it would not. ``homes``: home directories known to be on the hosts
    (``known_homes``)."""
    where = normalize(dst)
    shown = "" if where == dst else f" (that is {where})"
    if where.startswith("/"):
        if where in SYSTEM_DIRS or _LIB.fullmatch(where):
            what = "the root directory" if where == "/" else "a top-level system directory"
            return f"{dst}{shown} is {what}"
        if any(where == normalize(h) for h in homes if h.startswith("/")):
            return f"{dst}{shown} is a home directory itself"
        return None
    anchor, _, rel = where.partition("/")
    if anchor.startswith("~"):
        whose = "the remote user's home" if anchor == "~" else f"{anchor[1:]}'s home"
        if not rel:
            return f"{dst}{shown} is {whose} itself"
        if _above(rel):
            return f"{dst}{shown} is above {whose}"
        return None
    if where == ".":
        return f"{dst}{shown} is the remote user's home itself (a relative path is relative to it)"
    if _above(where):
        return f"{dst}{shown} is above the remote user's home (a relative path is relative to it)"
    return None


def known_homes(users: Iterable[str | None], own_home: str) -> tuple[str, ...]:
    """The home paths a destination is compared with: the launcher's own (``own_home``; a home
    shared with the hosts has the same path there) and ``/home/USER`` for each user a hostfile
    line names (``alice@node1``), where a Linux host keeps that user's home."""
    names = sorted({u for u in users if u and "/" not in u and u not in (".", "..")})
    return (own_home, *(f"/home/{u}" for u in names))


def check_sync_dst(dst: str | None, *, force: bool, homes: Iterable[str] = ()) -> None:
    """UsageError (exit 2) for a destination ``refusal`` names, unless ``force``; for an empty
    one; and for ``force`` without a destination (``None``)."""
    if dst is None:
        if force:
            raise UsageError(f"{FORCE_FLAG} insists on a --sync-dst-dir, and none was given")
        return
    if not dst:
        raise UsageError("--sync-dst-dir '': expected a directory on the hosts")
    why = refusal(dst, homes)
    if why is not None and not force:
        raise UsageError(
            f"--sync-dst-dir {why}: rsync would put this directory's files among what is there on "
            "every host (and change its mode and mtime); give a directory of the job's own, such as "
            f"~/myjob or /srv/myjob, or add {FORCE_FLAG} to sync there anyway"
        )
