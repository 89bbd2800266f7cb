"""The launcher's open-file limit, raised for a launch.

The launcher holds several descriptors per process of its job (the pipes its output comes
through, the kept output files, a remote host's connection): with a common soft limit of 1024
a launch of about 250 local processes (60 at a soft limit of 256) failed with "Too many open
files". ``raise_open_files`` lifts the soft limit to the hard one (what any process may do
itself), as servers that hold many connections do; the job's processes inherit it.
"""

from __future__ import annotations

import contextlib
import resource

#: the soft limit asked for where the hard one is unlimited (Linux bounds it by fs.nr_open)
UNLIMITED_TARGET = 1 << 20


def raise_open_files() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit; returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = UNLIMITED_TARGET if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
