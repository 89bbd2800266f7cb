"""The shim's task table (``LAUNCHKIT_SHIM_TASKS``), compressed so its size does not grow with
the job: what engine rank r runs (the plan index and the task's own variables). Pure.

A plan's rows are regular: in any engine's rank order, consecutive rows of one role on one host
differ by a constant step in their numbers (plan index, task id, role rank, local rank, GPU ids),
and the rows of one host differ from the next host's by a constant step too. So the table is
written as *groups*: a group repeats ``rep`` times a period of *runs*; a run is ``n`` rows from
a first row and a step per row (``di``, ``d``); each repeat of the period adds the run's repeat
step (``rdi``, ``rd``) to its first row. A value's step is one integer per number in it (a maximal
run of digits written without a leading zero, under 19 digits: ``"7"``, ``"2,3"``,
``"/tmp/launchkit-J-attempt0-worker3-error.json"``), its text between the numbers the same in
every row of its run; a value without such numbers is the same in every row of its run. 5000 tasks over 625 hosts take
a few hundred bytes where one row per task took about 100 bytes each (Linux refuses one
environment string over 128 KiB, ``MAX_ARG_STRLEN``: about 1100 tasks)::

    {"v": 2, "n": 6, "groups": [{"rep": 2, "runs": [{"n": 3, "i": 1, "env": {"DMLC_TASK_ID": "0", ...},
      "di": 2, "d": {"DMLC_TASK_ID": [2]}, "rdi": 1, "rd": {"DMLC_TASK_ID": [1]}}]}]}

A table whose steps apply to a value other than a comma-separated list of numbers is version 3
(a reader of version 2 knew only those); others are still written as version 2. Version 1
(``{"v": 1, "tasks": [{"i": .., "env": {..}}, ...]}``, one row per task) is still read. A later
version is refused, naming the launchkit versions apart.
Slurm's batch job writes each srun step's placement the same way (``LAUNCHKIT_BATCH``: row k's
index is the node of the step's task k, with no variables; ``rows`` decodes a whole table).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_DIGITS = re.compile(r"([0-9]+)")
_NUMBER = re.compile(r"0|[1-9][0-9]{0,17}")
_LIST = re.compile(r"(0|[1-9][0-9]{0,17})(,(0|[1-9][0-9]{0,17}))*")  # all version 2 could step
VERSIONS = (1, 2, 3)
#: The longest period of runs a group repeats (a host's rows: a few roles and GPU layouts).
MAX_PERIOD = 8
Step = tuple[tuple[int, ...], ...]  # per field: the difference (empty: a value that never changes)


def _split(value: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The value's text between its numbers (one more piece than numbers) and its numbers. A run
    of digits with a leading zero or too long is text: its step would not keep its form."""
    parts = _DIGITS.split(value)  # text, digits, text, digits, ..., text
    texts, numbers = [parts[0]], []
    for digits, text in zip(parts[1::2], parts[2::2], strict=True):
        if _NUMBER.fullmatch(digits):
            numbers.append(int(digits))
            texts.append(text)
        else:
            texts[-1] += digits + text
    return tuple(texts), tuple(numbers)


@dataclass(frozen=True)
class _Row:
    keys: tuple[str, ...]  # "" first: the plan index; then the task's own variable names, sorted
    values: tuple[str, ...]
    parts: tuple[tuple[tuple[str, ...], tuple[int, ...]], ...]  # per value: _split

    @staticmethod
    def of(index: int, env: Mapping[str, str]) -> _Row:
        keys = ("", *sorted(env))
        values = tuple(str(index) if k == "" else str(env[k]) for k in keys)
        return _Row(keys, values, tuple(_split(v) for v in values))


def _step(a: _Row, b: _Row) -> Step | None:
    """What takes row a to row b, or None when no step does (different names or text)."""
    if a.keys != b.keys:
        return None
    out: list[tuple[int, ...]] = []
    for (ta, na), (tb, nb) in zip(a.parts, b.parts, strict=True):
        if ta != tb or len(na) != len(nb):
            return None  # different text: no step takes one value to the other
        out.append(tuple(y - x for x, y in zip(na, nb, strict=True)) if na else ())
    return tuple(out)


@dataclass(frozen=True)
class _Run:
    first: _Row
    step: Step
    n: int


def _runs(rows: Sequence[_Row]) -> list[_Run]:
    runs: list[_Run] = []
    j = 0
    while j < len(rows):
        step = _step(rows[j], rows[j + 1]) if j + 1 < len(rows) else None
        n = 1
        if step is not None:
            n = 2
            while j + n < len(rows) and _step(rows[j + n - 1], rows[j + n]) == step:
                n += 1
        runs.append(_Run(rows[j], step or tuple(() for _ in rows[j].keys), n))
        j += n
    return runs


def _same_shape(a: _Run, b: _Run) -> bool:
    return a.n == b.n and a.step == b.step


def _repeats(runs: Sequence[_Run], j: int, p: int) -> tuple[int, list[Step]]:
    """How often runs[j:j+p] repeats from j, each run of it by its own step per repeat (and
    those steps)."""
    if j + 2 * p > len(runs):
        return 1, []
    shifts: list[Step] = []
    for q in range(p):
        shift = _step(runs[j + q].first, runs[j + p + q].first)
        if shift is None:
            return 1, []
        shifts.append(shift)
    rep = 1
    while j + (rep + 1) * p <= len(runs):
        here, there = j + (rep - 1) * p, j + rep * p
        if not all(
            _same_shape(runs[here + q], runs[there + q])
            and _step(runs[here + q].first, runs[there + q].first) == shifts[q]
            for q in range(p)
        ):
            break
        rep += 1
    return rep, shifts if rep > 1 else []


def _steps_json(keys: tuple[str, ...], step: Step, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if step[0] and step[0][0]:
        out[prefix + "di"] = step[0][0]
    if d := {k: list(s) for k, s in zip(keys[1:], step[1:], strict=True) if any(s)}:
        out[prefix + "d"] = d
    return out


def _run_json(run: _Run, shift: Step | None) -> dict[str, Any]:
    env = dict(zip(run.first.keys[1:], run.first.values[1:], strict=True))
    out: dict[str, Any] = {"n": run.n, "i": int(run.first.values[0]), "env": env}
    out.update(_steps_json(run.first.keys, run.step))
    if shift is not None:  # what each repeat of its group adds
        out.update(_steps_json(run.first.keys, shift, "r"))
    return out


def encode(rows: Sequence[tuple[int, Mapping[str, str]]]) -> str:
    """The table for ``rows`` (row r: the plan index and the own variables of engine rank r)."""
    runs = _runs([_Row.of(i, env) for i, env in rows])
    groups: list[dict[str, Any]] = []
    j = 0
    while j < len(runs):
        rep, p, shifts = 1, 1, []  # the period covering the most runs
        for period in range(1, min(MAX_PERIOD, (len(runs) - j) // 2) + 1):
            times, steps = _repeats(runs, j, period)
            if steps and times * period > rep * p:
                rep, p, shifts = times, period, steps
        period_runs = runs[j : j + p]
        groups.append(
            {
                "rep": rep,
                "runs": [_run_json(r, shifts[q] if shifts else None) for q, r in enumerate(period_runs)],
            }
        )
        j += rep * p
    text_steps = any(
        not _LIST.fullmatch(run["env"][name])
        for group in groups
        for run in group["runs"]
        for name in {*run.get("d", {}), *run.get("rd", {})}
    )
    version = 3 if text_steps else 2
    return json.dumps({"v": version, "n": len(rows), "groups": groups}, separators=(",", ":"))


def _version(table: Mapping[str, Any]) -> int:
    version = table.get("v")
    if version not in VERSIONS:
        raise ValueError(
            f"a task table of version {version}, and this launchkit reads versions 1 to {VERSIONS[-1]}: "
            "the launcher's launchkit is newer than this host's (install the same version on both)"
        )
    return int(version)


def _add(value: str, step: list[int], times: int) -> str:
    texts, numbers = _split(value)
    if len(numbers) != len(step):
        raise ValueError(f"a step of {len(step)} numbers for the value {value!r}")
    out = [texts[0]]
    for n, s, text in zip(numbers, step, texts[1:], strict=True):
        out += [str(n + s * times), text]
    return "".join(out)


def size(table: Mapping[str, Any]) -> int:
    """How many tasks the parsed table holds."""
    if _version(table) == 1:
        return len(table["tasks"])
    return sum(int(g["rep"]) * sum(int(r["n"]) for r in g["runs"]) for g in table["groups"])


def _row_of(run: Mapping[str, Any], row: int, m: int) -> tuple[int, dict[str, str]]:
    """Row ``row`` of ``run`` in its group's repeat ``m``."""
    index = int(run["i"]) + row * int(run.get("di", 0)) + m * int(run.get("rdi", 0))
    env = {str(k): str(v) for k, v in run["env"].items()}
    for name, step in run.get("d", {}).items():
        env[name] = _add(env[name], step, row)
    for name, step in run.get("rd", {}).items():
        env[name] = _add(env[name], step, m)
    return index, env


def rows(table: Mapping[str, Any]) -> Iterator[tuple[int, dict[str, str]]]:
    """Every row of the parsed table in order: what ``lookup`` gives row by row, in one pass."""
    if _version(table) == 1:
        for found in table["tasks"]:
            yield int(found["i"]), {str(k): str(v) for k, v in found["env"].items()}
        return
    for group in table["groups"]:
        for m in range(int(group["rep"])):
            for run in group["runs"]:
                for row in range(int(run["n"])):
                    yield _row_of(run, row, m)


def lookup(raw: str, row: int) -> tuple[int, dict[str, str]]:
    """(the plan index, the own variables) of ``row``. ValueError for a row outside the table or a
    table that is not one (KeyError, TypeError for a malformed one)."""
    table = json.loads(raw)
    total = size(table)
    if not 0 <= row < total:
        raise ValueError(f"engine rank {row} outside the job's {total} tasks")
    if table.get("v") == 1:
        found = table["tasks"][row]
        return int(found["i"]), {str(k): str(v) for k, v in found["env"].items()}
    for group in table["groups"]:
        period = sum(int(r["n"]) for r in group["runs"])
        if row >= int(group["rep"]) * period:
            row -= int(group["rep"]) * period
            continue
        m, row = divmod(row, period)
        for run in group["runs"]:
            if row >= int(run["n"]):
                row -= int(run["n"])
                continue
            return _row_of(run, row, m)
    raise ValueError(f"engine rank {row} not in the task table")  # pragma: no cover - size() checked
