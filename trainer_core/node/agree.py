"""Collective calls at the scheduler: who waits where, and what the workers agreed on (pure).

A worker enters a collective call with the scheduler (``barrier`` or ``agree``) under a label
saying which call of its API it is in (``"barrier()"``, ``"init()"``,
``"set_gradient_compression()"``, ...). ``agree`` also carries a value, a canonical JSON text (``canonical``; never a pickle): the
job-wide setting this worker asks for. ``Meeting`` collects them; once every worker is waiting,
``Meeting.outcome`` says what each is told:

* all in the same call, every value given the same: that value (or none, for a barrier);
* all in the same call, values that differ: an error naming each value and the ranks that gave
  it, for every worker (``differ``);
* in different calls (one in ``barrier``, another in ``set_optimizer``): an error naming who is
  where, for every worker (``out_of_step``), as neither call can complete.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: the longest value a worker may ask to agree on (bytes of its canonical JSON)
MAX_VALUE = 16 * 1024


def canonical(value: Any) -> str:
    """``value`` (plain data: dicts, lists, strings, numbers, booleans, None) as the one JSON text
    that every worker writes for it: sorted keys, no spaces; ``TypeError`` for anything else."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def show(text: str) -> str:
    """A canonical JSON value as written in a message (``null`` reads as ``none``)."""
    return "none" if text == "null" else text


@dataclass
class Waiter:
    """One worker waiting at the scheduler."""

    rank: int
    label: str
    op: str  # the message kind it sent (barrier or agree)
    value: str | None  # canonical JSON; None: the worker gives no value (a barrier, or not rank 0's)
    peer: Any
    seq: int


def _ranks(ranks: list[int]) -> str:
    word = "worker" if len(ranks) == 1 else "workers"
    return f"{word} {', '.join(str(r) for r in sorted(ranks))}"


def out_of_step(waiters: list[Waiter], finished: Sequence[int] = ()) -> str:
    """Every worker waits, in different calls: who is where."""
    by_label: dict[str, list[int]] = {}
    for w in waiters:
        by_label.setdefault(w.label, []).append(w.rank)
    where = [
        f"{_ranks(ranks)} in {label}" for label, ranks in sorted(by_label.items(), key=lambda x: min(x[1]))
    ]
    if finished:
        where.append(f"{_ranks(list(finished))} finished")
    return (
        "the workers are in different collective calls, which can never complete: "
        + "; ".join(where)
        + " (every worker makes the same collective calls in the same order)"
    )


def differ(label: str, waiters: list[Waiter]) -> str | None:
    """The error when the values given in call ``label`` differ (``None``: they agree)."""
    by_value: dict[str, list[int]] = {}
    for w in waiters:
        if w.value is not None:
            by_value.setdefault(w.value, []).append(w.rank)
    if len(by_value) <= 1:
        return None
    said = "; ".join(
        f"{_ranks(ranks)}: {show(v)}" for v, ranks in sorted(by_value.items(), key=lambda x: min(x[1]))
    )
    return (
        f"{label}: the workers gave different settings, {said} (every worker must give the same; "
        "it is a setting of the whole job)"
    )


class Meeting:
    """The workers waiting at the scheduler, by rank."""

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers
        self.waiting: dict[int, Waiter] = {}

    def add(self, w: Waiter) -> None:
        self.waiting[w.rank] = w

    def outcome(self) -> tuple[dict[str, Any], list[Waiter]]:
        """What to answer every waiter with (``{"value": text}``, ``{}`` or ``{"error": text}``),
        and the waiters; the meeting is empty afterwards."""
        waiters = sorted(self.waiting.values(), key=lambda w: w.rank)
        self.waiting.clear()
        calls = {(w.op, w.label) for w in waiters}
        if len(calls) > 1:
            return {"error": out_of_step(waiters)}, waiters
        error = differ(waiters[0].label, waiters)
        if error is not None:
            return {"error": error}, waiters
        given = [w.value for w in waiters if w.value is not None]
        return ({"value": given[0]} if given else {}), waiters
