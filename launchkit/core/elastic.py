"""Elastic jobs (``launchkit launch -n MIN:MAX``), the pure part: the ``-n`` value, the workers a
job starts with, which hosts a new worker may go to (the hosts offered, their slots, the
blacklist with its cool-down), and the ``host:slots`` lines of a discovery script. No clock, no
file, no process: the supervisor (``launchkit.elastic``) passes the time and does the effects.
docs/elastic.md, "In launchkit"."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from launchkit.core.capabilities import Elasticity
from launchkit.core.placement import MAX_PER_ROLE, machine_key, uses_slots
from launchkit.core.spec import Host
from launchkit.errors import UsageError

COOL_DOWN = 10.0  # seconds a host is blacklisted after its first worker failure
COOL_DOWN_CAP = 300.0  # the longest cool-down, however often a host failed (doubling from COOL_DOWN)

WORKERS_FORMS = "N, or MIN:MAX for an elastic job (1 <= MIN <= MAX)"


def parse_workers(text: str) -> tuple[int, tuple[int, int] | None]:
    """``-n``'s value: ``N`` -> (N, None); ``MIN:MAX`` -> (MAX, (MIN, MAX)), torchrun's form of
    ``--nnodes``. ValueError naming what was expected; the bounds are ``check_workers``'s."""
    words = text.strip().split(":")
    if len(words) > 2 or not all(w.strip().isdigit() for w in words):
        raise ValueError(f"{text!r}: expected {WORKERS_FORMS}")
    numbers = [int(w) for w in words]
    if len(numbers) == 1:
        return numbers[0], None
    return numbers[1], (numbers[0], numbers[1])


def check_bounds(bounds: tuple[int, int]) -> None:
    """MIN and MAX themselves (UsageError): 1 <= MIN <= MAX <= MAX_PER_ROLE."""
    low, high = bounds
    if low < 1:
        raise UsageError(f"-n {low}:{high}: MIN must be at least 1 (an elastic job needs a worker)")
    if low > high:
        raise UsageError(f"-n {low}:{high}: MIN is above MAX; expected {WORKERS_FORMS}")
    if high > MAX_PER_ROLE:
        raise UsageError(f"-n {low}:{high}: expected MAX at most {MAX_PER_ROLE}")


def capacity(hosts: Iterable[Host]) -> int | None:
    """The workers the hosts offer: the sum of their slots (a host without ``slots=`` counts as
    one) when any host has ``slots=``; None (no bound: workers cycle over the hosts, MXNet's
    rule, docs/placement.md) when none has."""
    listed = tuple(hosts)
    if not uses_slots(listed):
        return None
    return sum(h.slots or 1 for h in listed)


def start_size(bounds: tuple[int, int], hosts: Iterable[Host], elasticity: Elasticity, backend: str) -> int:
    """The workers an elastic job starts with: min(MAX, what the hosts offer), at least MIN.
    A backend that only shrinks starts MAX, all of which must fit (it can never add one later).
    UsageError naming the numbers otherwise."""
    low, high = bounds
    offered = capacity(hosts)
    if elasticity == "shrink":
        if offered is not None and offered < high:
            raise UsageError(
                f"-n {low}:{high}: --launcher {backend} cannot add workers to a running job, so it starts "
                f"MAX; its allocation offers {offered} slots: lower MAX to {offered} or less"
            )
        return high
    if offered is None:
        return high
    if offered < low:
        raise UsageError(
            f"-n {low}:{high}: the hostfile offers {offered} slots, fewer than MIN ({low}); "
            "add hosts or slots, or lower MIN"
        )
    return min(high, offered)


# -- the blacklist ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Penalty:
    """A host's worker failures: how many, and until when it is not used (``time.monotonic``)."""

    failures: int
    until: float


Blacklist = Mapping[tuple[str, int | None], Penalty]  # by machine (``machine_key``)


def cool_down(failures: int, base: float = COOL_DOWN, cap: float = COOL_DOWN_CAP) -> float:
    """Seconds a host waits after its ``failures``-th failure: ``base``, doubling, at most ``cap``."""
    return float(min(cap, base * 2 ** max(failures - 1, 0)))


def blacklist(
    current: Blacklist, host: Host, now: float, base: float = COOL_DOWN, cap: float = COOL_DOWN_CAP
) -> dict[tuple[str, int | None], Penalty]:
    """``current`` after a worker on ``host`` failed at ``now``."""
    key = machine_key(host)
    failures = current[key].failures + 1 if key in current else 1
    return {**current, key: Penalty(failures, now + cool_down(failures, base, cap))}


def blocked(current: Blacklist, host: Host, now: float) -> bool:
    """Whether ``host`` is still in its cool-down at ``now``."""
    penalty = current.get(machine_key(host))
    return penalty is not None and now < penalty.until


# -- where new workers go -------------------------------------------------------------------------


def new_workers(
    hosts: Iterable[Host],
    live: Mapping[tuple[str, int | None], int],
    wanted: int,
    blacklisted: Blacklist,
    now: float,
) -> list[Host]:
    """The hosts of up to ``wanted`` new workers: hosts of ``hosts`` not in their cool-down, each
    up to its free slots (its ``slots=`` minus its ``live`` workers, by ``machine_key``; without
    ``slots=`` on any host, no bound), the least loaded first, in hostfile order on a tie."""
    listed: list[Host] = []
    for h in hosts:  # one entry per machine; a machine listed twice adds its slots
        key = machine_key(h)
        same = next((i for i, x in enumerate(listed) if machine_key(x) == key), None)
        if same is None:
            listed.append(h)
        elif h.slots is not None or listed[same].slots is not None:
            listed[same] = dataclasses.replace(listed[same], slots=(listed[same].slots or 1) + (h.slots or 1))
    usable = [h for h in listed if not blocked(blacklisted, h, now)]
    bounded = uses_slots(listed)
    load = {machine_key(h): live.get(machine_key(h), 0) for h in usable}
    chosen: list[Host] = []
    for _ in range(max(wanted, 0)):
        free = [h for h in usable if not bounded or load[machine_key(h)] < (h.slots or 1)]
        if not free:
            break
        pick = min(free, key=lambda h: load[machine_key(h)])  # (min keeps the first on a tie)
        load[machine_key(pick)] += 1
        chosen.append(pick)
    return chosen


def wanted_workers(bounds: tuple[int, int], live: int, finishing: bool, elasticity: Elasticity) -> int:
    """How many workers to start now: up to MAX, none on a backend that cannot add one or once
    the job is finishing (a worker succeeded: training is over)."""
    if elasticity != "resize" or finishing:
        return 0
    return max(bounds[1] - live, 0)


# -- host discovery --------------------------------------------------------------------------------


def parse_discovered(text: str) -> list[Host]:
    """A discovery script's output (Horovod's contract): one ``host:slots`` line per host (``host``
    alone: one slot); blank lines are skipped. ValueError naming the line otherwise."""
    hosts: list[Host] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        name, colon, slots = line.rpartition(":")
        if not colon or "]" in slots:  # no slots, or a bracketed IPv6 address without them
            name, slots = line, "1"
        if not name or not slots.isdigit() or not 1 <= int(slots) <= 1_000_000:
            raise ValueError(f"line {number}: {raw!r}: expected host:slots (slots from 1 to 1000000)")
        name = name[1:-1] if name.startswith("[") and name.endswith("]") else name
        if any(c.isspace() for c in name):
            raise ValueError(f"line {number}: {raw!r}: expected host:slots, one host per line")
        hosts.append(Host(name, slots=int(slots), line=number))
    return hosts


def host_counts(workers: Iterable[Host]) -> dict[tuple[str, int | None], int]:
    """The live workers per machine."""
    counts: dict[tuple[str, int | None], int] = {}
    for h in workers:
        counts[machine_key(h)] = counts.get(machine_key(h), 0) + 1
    return counts
