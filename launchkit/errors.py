"""Structured errors. Every user-facing failure is one of these; the CLI turns them into a
message and an exit code (see docs/exit-codes.md), never a traceback."""

from __future__ import annotations

# Exit codes of the launcher itself (a failed job exits with its root cause's code instead).
EXIT_USAGE = 2  # bad flags, bad hostfile, impossible placement: nothing was started
EXIT_INTERNAL = 1  # a bug in launchkit, or a backend that failed in an unexpected way
EXIT_SIGINT = 130
EXIT_IO = 74  # EX_IOERR: launchkit's own output could not be written (a full disk, a closed pipe)


class LaunchkitError(Exception):
    """Base class: a message for the user and the exit code the CLI should use."""

    exit_code = EXIT_INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(LaunchkitError):
    """Bad input on the command line; nothing was started."""

    exit_code = EXIT_USAGE


class HostfileError(UsageError):
    """A hostfile that cannot be parsed: names the file and the line."""

    def __init__(self, path: str, line: int | None, message: str) -> None:
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {message}")
        self.path = path
        self.line = line
        self.detail = message


class PlacementError(UsageError):
    """The job does not fit on the hosts (e.g. more workers than slots)."""


class BackendError(LaunchkitError):
    """A backend could not start or reach its processes."""

    def __init__(self, backend: str, message: str, exit_code: int = EXIT_INTERNAL) -> None:
        super().__init__(f"{backend}: {message}")
        self.backend = backend
        self.exit_code = exit_code
