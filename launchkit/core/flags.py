"""The flags of ``launchkit launch`` that backends take, declared next to the backend that takes
them: an ``EngineFlag`` is one option (its names, help, type, default), the field of the
backend's options it fills and how its value is checked. A backend lists the flags it takes in
its ``Capabilities.flags``; the command line renders every flag of the registered backends (the
option, its group in the help) and refuses one given for a backend that does not list it. Pure.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from launchkit.errors import UsageError

#: (the flag as the help names it, its value) -> the value its field gets; UsageError when wrong
Check = Callable[[str, Any], Any]


@dataclass(frozen=True)
class EngineFlag:
    """One option: ``EngineFlag("-i/--identity", "ssh private key file.")``."""

    #: its names, "/" between them, the long one last: ``--queue``, ``-i/--identity``
    label: str
    help: str
    type: type = str  # str, int, float or bool (a switch)
    default: Any = None  # None: not given
    #: repeatable: its value is a tuple of the values given
    multiple: bool = False
    #: the field (or constructor keyword) of the backend's options it fills; default: ``name``
    fills: str = ""
    #: checks or converts the value given (or the default) into the field's value
    check: Check | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.label.split("/"))

    @property
    def name(self) -> str:
        """Its parameter name: the long option without dashes (``--sge-args``: ``sge_args``)."""
        return self.names[-1].lstrip("-").replace("-", "_")

    @property
    def field(self) -> str:
        return self.fills or self.name

    def value(self, flags: Mapping[str, Any]) -> Any:
        """Its field's value from ``flags`` (every flag's value by name), checked."""
        value = flags.get(self.name, self.default)
        if self.multiple:
            value = tuple(value or ())
        return value if self.check is None else self.check(self.label, value)


def fill(flags: Iterable[EngineFlag], values: Mapping[str, Any]) -> dict[str, Any]:
    """Each flag's field with its value (checked): the keyword arguments of the options it fills."""
    return {flag.field: flag.value(values) for flag in flags}


def split_words(label: str, value: str) -> tuple[str, ...]:
    """A flag that carries more flags (``--slurm-args``), split as a shell would (no shell runs)."""
    try:
        return tuple(shlex.split(value or ""))
    except ValueError as exc:
        raise UsageError(f"{label} {value!r}: {exc}") from None


def positive(label: str, value: float) -> float:
    """Seconds that must be more than 0 (the command line's bounds already hold the rest)."""
    if value is not None and value <= 0:
        raise UsageError(f"{label} must be more than 0, got {value:g}")
    return value


def at_least_one(label: str, value: int | None) -> int | None:
    if value is not None and value < 1:
        raise UsageError(f"{label} must be at least 1, got {value}")
    return value
