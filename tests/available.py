"""``skip_without(module)``: skip the calling test module where ``module`` is not installed,
without importing it. ``pytest.importorskip("sklearn")`` at a module's top imports scikit-learn
(with scipy, about a second of CPU) in every pytest process that collects the module (each xdist
worker, ``--collect-only``), whether or not it runs a test of it; the tests that need it import it
themselves (or their job's processes do)."""

from __future__ import annotations

import importlib.util

import pytest


def skip_without(module: str, reason: str | None = None) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(reason or f"could not import {module!r}: not installed", allow_module_level=True)
