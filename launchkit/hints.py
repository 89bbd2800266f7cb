"""A line the failure report adds where the root cause's last lines show a known mistake of the
command line rather than of the program. Pure: the role and the lines in, the hint or None out.

One mistake so far: a ``torch.distributed`` script launched with servers. ``-s`` defaults to
``-n``, so a plain ``launchkit launch -n 2 python ddp.py`` also runs the script as the scheduler
and two servers; they get no torch variables (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ...:
those are the workers', docs/environment.md), and the first of them to reach
``init_process_group`` failed the job with torch's "environment variable RANK expected, but not
set", naming a server, with nothing to say that ``-s 0`` was meant.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

TORCH_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)
_NAMES = "|".join(TORCH_VARIABLES)
# torch's env:// rendezvous ("environment variable RANK expected, but not set") and a script's
# own os.environ["LOCAL_RANK"] (KeyError: 'LOCAL_RANK')
_MISSING = re.compile(rf"environment variable ({_NAMES}) expected|KeyError: '({_NAMES})'")


def hint(role: str, lines: Iterable[str]) -> str | None:
    """What to say below the report of ``role``'s failure with these last ``lines``; None when
    nothing is known."""
    if role == "worker":
        return None
    for line in lines:
        found = _MISSING.search(line)
        if found:
            name = found.group(1) or found.group(2)
            who = "the scheduler runs" if role == "scheduler" else f"the {role}s run"
            return (
                f"{who} the command too, and torch's variables ({name}, WORLD_SIZE, "
                f"MASTER_ADDR, ...) are the workers' only: for a torch.distributed script, "
                f"launch the workers alone with -s 0 (-s defaults to -n)"
            )
    return None
