"""An elastic job's membership in its record: each change (``Change``: its epoch, who left and
why, who joined, how the others went on), read back from JSON with every field checked (a record
written before elastic jobs has none). ``launchkit ps`` and ``logs`` show them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Change:
    """One membership change: its epoch, when (``time.time``), who left and why, who joined."""

    epoch: int
    at: float
    left: tuple[str, ...] = ()
    joined: tuple[str, ...] = ()
    how: str = ""  # "in process" (the survivors kept running), "restart N of the workers", ...

    def line(self) -> str:
        parts = [f"epoch {self.epoch}"]
        if self.left:
            parts.append("left: " + ", ".join(self.left))
        if self.joined:
            parts.append("joined: " + ", ".join(self.joined))
        if self.how:
            parts.append(self.how)
        return "; ".join(parts)


def change_from_json(i: int, data: Any) -> Change:
    """``changes[i]`` of a record; ValueError naming the field that is wrong."""
    where = f"changes[{i}]"
    if not isinstance(data, dict):
        raise ValueError(f"field {where!r}: expected an object")
    epoch, at = data.get("epoch"), data.get("at")
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        raise ValueError(f"field '{where}.epoch': expected a whole number")
    if not isinstance(at, int | float) or isinstance(at, bool):
        raise ValueError(f"field '{where}.at': expected a number")
    texts: dict[str, tuple[str, ...]] = {}
    for name in ("left", "joined"):
        value = data.get(name, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"field '{where}.{name}': expected a list of strings")
        texts[name] = tuple(value)
    how = data.get("how", "")
    if not isinstance(how, str):
        raise ValueError(f"field '{where}.how': expected a string")
    return Change(epoch, float(at), texts["left"], texts["joined"], how)
