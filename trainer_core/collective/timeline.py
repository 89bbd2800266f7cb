"""A group's timeline: each operation's phases as a Chrome trace (``chrome://tracing``, Perfetto),
Horovod's ``HOROVOD_TIMELINE``.

One row per operation name (a trace "process" named after it, as Horovod's one row per tensor);
on it, each operation as three spans: ``QUEUED`` from its submission until its slot began,
``NEGOTIATE_<KIND>`` while the ranks agreed on it, and ``<KIND>`` (``ALLREDUCE``, ``BROADCAST``,
...) while its data moved, until it was done; the span carries the operation's number, its bytes
and how it ended. A fused batch of allreduces (tensor fusion) adds a ``MEMCPY_IN_FUSION_BUFFER``
span on a row of its own, naming the operations it carried. Events are written as they end (one JSON object per line after the opening
``[``), so a trace cut short by a crash still loads; ``close`` ends the array.

A process set's operations go to rows of their own (``for_set``: the row's name and every span's
``args`` name the set), so that an operation of a set and one of the global set with the same name
never share a row. Which process writes which set is ``writer_of``'s rule: global rank 0 writes the
global set and every set it is in (Horovod's coordinator writes the one file, and records what runs
through its own process); a set without rank 0 is written by its first member, to a file of its own
(``set_path``), since Horovod's file would not have it at all.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import IO, Protocol

#: the row of the fused batches' spans
FUSION_ROW = "fusion buffer"


@dataclass(frozen=True)
class Phases:
    """One operation's clock readings (``time.monotonic()``), in order."""

    submitted: float
    started: float  # its slot began: the ranks started agreeing on it
    agreed: float  # every rank holds it: its data starts moving
    done: float


class Recorder(Protocol):
    """Where a group's finished operations go (``Negotiator.timeline``)."""

    def operation(
        self, name: str, kind: str, seq: int, phases: Phases, nbytes: int, error: str | None
    ) -> None: ...

    def fused(self, names: list[str], seq: int, start: float, end: float, nbytes: int) -> None: ...


def writer_of(members: Sequence[int]) -> int:
    """The global rank that records the operations of the process set of ``members``: rank 0 where
    it is a member (Horovod's coordinator), else the set's first member."""
    return 0 if 0 in members else min(members)


def set_path(path: str, members: Sequence[int]) -> str:
    """The file a set without rank 0 is recorded in: ``timeline.json`` -> ``timeline.set-1-2.json``
    for the set of ranks 1 and 2."""
    p = PurePath(path)
    tag = "set-" + "-".join(str(m) for m in sorted(members))
    return str(p.with_name(f"{p.stem}.{tag}{p.suffix}" if p.suffix else f"{p.name}.{tag}"))


def set_label(sid: int, members: Sequence[int]) -> str:
    """How a row names its process set."""
    return f"process set {sid} {list(members)}"


class Timeline:
    """Writes one group's operations to ``path`` (thread-safe; ``rank`` is the trace's label)."""

    def __init__(self, path: str, rank: int = 0, mark_cycles: bool = False) -> None:
        self.path, self.rank, self.mark_cycles = path, rank, mark_cycles
        self._file: IO[str] | None = open(path, "w", encoding="utf-8")  # noqa: SIM115 (closed by close())
        self._file.write("[\n")
        self._lock = threading.Lock()
        self._rows: dict[str, int] = {}
        self._origin = time.monotonic()
        self._first = True

    def _us(self, t: float) -> int:
        return max(0, round((t - self._origin) * 1e6))

    def _write(self, event: dict[str, object]) -> None:
        assert self._file is not None
        self._file.write(("" if self._first else ",\n") + json.dumps(event, separators=(",", ":")))
        self._first = False

    def _row(self, name: str) -> int:
        row = self._rows.get(name)
        if row is None:
            row = self._rows[name] = len(self._rows) + 1
            self._write({"name": "process_name", "ph": "M", "pid": row, "args": {"name": name}})
            self._write({"name": "process_sort_index", "ph": "M", "pid": row, "args": {"sort_index": row}})
        return row

    def operation(
        self,
        name: str,
        kind: str,
        seq: int,
        phases: Phases,
        nbytes: int,
        error: str | None,
        process_set: tuple[int, Sequence[int]] | None = None,
    ) -> None:
        """Record one finished operation (``error``: why it failed; None: it succeeded;
        ``process_set``: the id and global ranks of its set, None: the global set)."""
        with self._lock:
            if self._file is None:
                return
            args: dict[str, object] = {"operation": seq, "bytes": nbytes, "rank": self.rank}
            if process_set is None:
                row = self._row(name)
            else:
                sid, members = process_set
                label = set_label(sid, members)
                row = self._row(f"{name} ({label})")
                args["process_set"] = label
            if error is not None:
                args["error"] = error
            spans = (
                ("QUEUED", phases.submitted, phases.started),
                (f"NEGOTIATE_{kind.upper()}", phases.started, phases.agreed),
                (kind.upper(), phases.agreed, phases.done),
            )
            for label, start, end in spans:
                self._write(
                    {
                        "name": label,
                        "ph": "X",
                        "pid": row,
                        "tid": 0,
                        "ts": self._us(start),
                        "dur": max(0, self._us(end) - self._us(start)),
                        "args": args,
                    }
                )
            if self.mark_cycles:
                self._write(
                    {"name": "CYCLE_START", "ph": "i", "s": "g", "pid": row, "ts": self._us(phases.started)}
                )
            self._file.flush()

    def for_set(self, sid: int, members: Sequence[int]) -> SetRows:
        """What a process set's group records through this timeline (its own rows)."""
        return SetRows(self, sid, tuple(members))

    def fused(self, names: list[str], seq: int, start: float, end: float, nbytes: int) -> None:
        """Record one fused batch (tensor fusion, ``batching``): a ``MEMCPY_IN_FUSION_BUFFER`` span
        while its inputs were copied into the fusion buffer, on the row ``FUSION_ROW``, naming the
        operations it carried (each also has its own row, its ``<KIND>`` span the whole batch's)."""
        with self._lock:
            if self._file is None:
                return
            args = {"operation": seq, "bytes": nbytes, "rank": self.rank, "tensors": names}
            self._write(
                {
                    "name": "MEMCPY_IN_FUSION_BUFFER",
                    "ph": "X",
                    "pid": self._row(FUSION_ROW),
                    "tid": 0,
                    "ts": self._us(start),
                    "dur": max(0, self._us(end) - self._us(start)),
                    "args": args,
                }
            )
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is None:
                return
            self._file.write("\n]\n")
            self._file.close()
            self._file = None


@dataclass(frozen=True)
class SetRows:
    """A process set's operations, on rows of their own in ``timeline`` (a ``Recorder``)."""

    timeline: Timeline
    sid: int
    members: tuple[int, ...]

    def operation(
        self, name: str, kind: str, seq: int, phases: Phases, nbytes: int, error: str | None
    ) -> None:
        self.timeline.operation(name, kind, seq, phases, nbytes, error, (self.sid, self.members))

    def fused(self, names: list[str], seq: int, start: float, end: float, nbytes: int) -> None:
        """A fused batch of the set's operations (on the timeline's fusion row, as the global set's)."""
        self.timeline.fused(names, seq, start, end, nbytes)
