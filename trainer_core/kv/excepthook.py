"""Once per worker process: an uncaught exception aborts the job at once (naming this worker)
instead of leaving the others waiting for its pushes."""

from __future__ import annotations

import sys
from types import TracebackType

from dmlc_env.ending import say_peer_failed
from trainer_core.errors import NodeFailure
from trainer_core.kv.api import _OPEN


def install_excepthook() -> None:
    """Chain a ``sys.excepthook`` that aborts every open store that can abort (dist stores), once."""
    previous = sys.excepthook
    if getattr(previous, "trainer_core", False):
        return

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        previous(kind, value, tb)
        if isinstance(value, NodeFailure):  # for the launcher, after the traceback: its last line
            say_peer_failed(value.node)
        for store in list(_OPEN):
            abort = getattr(store, "abort", None)
            if abort is not None:
                abort(f"uncaught {kind.__name__}: {value}")

    hook.trainer_core = True  # type: ignore[attr-defined]
    sys.excepthook = hook
