"""A backend the launcher has never heard of, with a flag of its own (``--knob``): everything it
adds is this module; ``test_cli_engineflags`` adds its one registry line."""

from __future__ import annotations

from launchkit.backends.base import Backend
from launchkit.core.capabilities import Capabilities
from launchkit.core.flags import EngineFlag, at_least_one
from launchkit.core.spec import Plan, Task

KNOB = EngineFlag("--knob", "How far to turn the knob.", int, 1, check=at_least_one)


class KnobBackend(Backend):
    name = "knob"
    capabilities = Capabilities(
        hosts="here", hostfile_ignored="it runs here", here=True, options=frozenset({"knob"}), flags=(KNOB,)
    )

    def __init__(self, knob: int = 1) -> None:
        self.knob = knob

    def notes(self, plan: Plan) -> list[str]:
        return [f"the knob is at {self.knob}"]

    def start(self, task: Task) -> object:  # type: ignore[override]
        raise NotImplementedError
