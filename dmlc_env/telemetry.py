"""The metrics wire: one signed UDP datagram per report, from any process of a job to the
launcher's metrics endpoint (``LAUNCHKIT_METRICS_ADDR``). docs/metrics.md describes it.

A datagram is a 32-byte HMAC-SHA256 tag, then a UTF-8 JSON object::

    {"v": 1, "job": JOB_ID, "role": ROLE, "rank": N, "pid": PID, "seq": N, "t": UNIX_TIME,
     "m": {FIGURE: NUMBER, ...}}

The tag is keyed with ``metrics_key(secret)``: derived from the job's secret
(``LAUNCHKIT_JOB_SECRET``) with a label, so a datagram proves that its sender holds the secret
without the secret itself keying anything but the derivation. ``decode`` accepts a datagram only
with the right tag, the right job, the right shape and finite numbers, at most ``MAX_DATAGRAM``
bytes; anything else is ``None``. Nothing received is evaluated: it is parsed as JSON and checked
field by field. Replays are refused by the receiver with ``Fresh`` (``seq`` only grows per sender).

Standard library only: launchkit (the endpoint) and trainer_core (the sender) both import it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

VERSION = 1
TAG_BYTES = 32
MAX_DATAGRAM = 4096
MAX_FIGURES = 64
MAX_NAME = 64
_LABEL = b"launchkit metrics v1"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]{0,63}$")
ROLES = ("scheduler", "server", "worker")


def metrics_key(secret: str) -> bytes:
    """The key that signs metrics datagrams, derived from the job's secret."""
    return hmac.new(secret.encode(), _LABEL, hashlib.sha256).digest()


@dataclass(frozen=True)
class Report:
    """One process's figures at one moment."""

    job: str
    role: str
    rank: int
    seq: int
    t: float
    figures: dict[str, float] = field(default_factory=dict)
    pid: int = 0


def figure_name(name: str) -> bool:
    """Whether ``name`` may name a figure: a letter or ``_``, then letters, digits, ``_`` or ``.``."""
    return bool(_NAME.match(name))


def finite_number(v: Any) -> TypeGuard[int | float]:
    """A finite number that fits a float (an int or a float, not a bool): the only figure values
    a report carries, checked wherever one is read."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an int beyond any float
        return False


def whole_number(v: Any) -> TypeGuard[int]:
    """An int of 0 or more (not a bool): a rank, a sequence number, a pid, a byte count."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def encode(key: bytes, report: Report) -> bytes:
    """The datagram for ``report`` (``key``: ``metrics_key(secret)``). Figures that are not finite
    numbers, or whose name is not a figure name, are left out. ``ValueError`` when the datagram
    would exceed ``MAX_DATAGRAM`` bytes or carry more than ``MAX_FIGURES`` figures."""
    figures = {k: v for k, v in report.figures.items() if figure_name(k) and finite_number(v)}
    if len(figures) > MAX_FIGURES:
        raise ValueError(f"a report carries at most {MAX_FIGURES} figures, not {len(figures)}")
    body = {
        "v": VERSION,
        "job": report.job,
        "role": report.role,
        "rank": report.rank,
        "pid": report.pid,
        "seq": report.seq,
        "t": report.t,
        "m": figures,
    }
    raw = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
    if TAG_BYTES + len(raw) > MAX_DATAGRAM:
        raise ValueError(f"a report is at most {MAX_DATAGRAM} bytes, this one {TAG_BYTES + len(raw)}")
    return hmac.new(key, raw, hashlib.sha256).digest() + raw


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


def decode(key: bytes, job: str, data: bytes) -> Report | None:
    """The report a datagram carries, or ``None``: wrong tag (another secret), another job, bad
    shape, too large, or a figure that is not a finite number."""
    if not TAG_BYTES < len(data) <= MAX_DATAGRAM:
        return None
    tag, raw = data[:TAG_BYTES], data[TAG_BYTES:]
    if not hmac.compare_digest(tag, hmac.new(key, raw, hashlib.sha256).digest()):
        return None
    try:
        d = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError):
        return None
    return _checked(d, job)


def _checked(d: Any, job: str) -> Report | None:
    if not isinstance(d, dict) or d.get("v") != VERSION or d.get("job") != job:
        return None
    role, rank, seq, t, pid, m = (d.get(k) for k in ("role", "rank", "seq", "t", "pid", "m"))
    if not (whole_number(rank) and whole_number(seq) and whole_number(pid)) or role not in ROLES:
        return None
    if not finite_number(t) or not isinstance(m, Mapping):
        return None
    if len(m) > MAX_FIGURES or not all(
        isinstance(k, str) and figure_name(k) and finite_number(v) for k, v in m.items()
    ):
        return None
    return Report(job, role, rank, seq, float(t), {k: float(v) for k, v in m.items()}, pid)


class Fresh:
    """The receiver's replay guard: per sender (role, rank), only a ``seq`` above the last
    accepted one passes. Senders start ``seq`` from the clock (microseconds), so a restarted
    process (same job, same secret) is not taken for a replay of its predecessor."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, int], int] = {}

    def __call__(self, report: Report) -> bool:
        who = (report.role, report.rank)
        if report.seq <= self._last.get(who, -1):
            return False
        self._last[who] = report.seq
        return True
