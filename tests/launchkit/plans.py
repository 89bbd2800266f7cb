"""``make_plan`` for tests: the plan of a spec on the backend it names, with that backend's
declared capabilities (``launchkit.backends.capabilities``), as the launcher builds it."""

from __future__ import annotations

from typing import Any

from launchkit import backends
from launchkit.core import plan
from launchkit.core.spec import LaunchSpec, Plan


def make_plan(spec: LaunchSpec, **kw: Any) -> Plan:
    return plan.make_plan(spec, caps=backends.capabilities(spec.backend), **kw)
