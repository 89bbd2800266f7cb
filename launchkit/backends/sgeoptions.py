"""What ``--launcher sge`` is told: ``SgeOptions``, and the flags of ``launchkit launch`` that fill
them (``FLAGS``), checked. Pure."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

from launchkit.backends.engineflags import QUEUE
from launchkit.core.flags import EngineFlag, split_words
from launchkit.errors import UsageError


@dataclass(frozen=True)
class SgeOptions:
    queue: str | None = None
    pe: str | None = None  # NAME or NAME:SLOTS, per task
    resources: tuple[str, ...] = ()  # -l, each
    extra: tuple[str, ...] = ()  # --sge-args, split
    python: str = sys.executable


#: the flags of ``launchkit launch`` that fill ``SgeOptions``
FLAGS = (
    QUEUE,
    EngineFlag("--pe", "Parallel environment per task, NAME[:SLOTS]."),
    EngineFlag("--sge-resource", "A resource (-l), repeatable.", multiple=True, fills="resources"),
    EngineFlag("--sge-args", "Extra qsub flags, one string.", default="", fills="extra", check=split_words),
)


def parse_pe(value: str) -> tuple[str, int]:
    """``--pe NAME[:SLOTS]`` (slots per task, default 1)."""
    name, colon, slots = value.partition(":")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or (colon and not (slots.isdigit() and int(slots) > 0)):
        raise UsageError(f"--pe {value!r}: expected NAME or NAME:SLOTS (a parallel environment, slots > 0)")
    return name, int(slots) if colon else 1
