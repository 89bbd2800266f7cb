"""Logging for the KV store, controlled by ``PS_VERBOSE`` (0: warnings and errors, 1: connections, 2: every message).

Library code never prints: it logs to the ``trainer_core`` logger. When ``PS_VERBOSE`` is above 0 and the
application configured no handler, one stderr handler is attached (once).
"""

from __future__ import annotations

import logging

LOGGER_NAME = "trainer_core"


def get_logger(verbose: int) -> logging.Logger:
    """The package logger, with a stderr handler when ``verbose`` > 0 and none is configured."""
    log = logging.getLogger(LOGGER_NAME)
    if verbose > 0:
        if not log.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("[%(asctime)s %(process)d] %(message)s"))
            log.addHandler(handler)
        log.setLevel(logging.DEBUG if verbose >= 2 else logging.INFO)
    return log
