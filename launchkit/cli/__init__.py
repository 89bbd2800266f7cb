"""The ``launchkit`` command line: one module per command, registered on the root app."""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import sys
from typing import NoReturn

from launchkit.errors import EXIT_INTERNAL, EXIT_IO, EXIT_SIGINT, LaunchkitError

try:  # the commands' modules take the first half second of every run
    from launchkit.cli import hosts, kill, launch, logs, ps, top
    from launchkit.cli.app import app
    from launchkit.console import Ui, refusal
except KeyboardInterrupt:  # Ctrl-C then: nothing has started; exit 130 as later, not a traceback
    raise SystemExit(EXIT_SIGINT) from None

# errors of writing (our output, a record) that are the machine's, not launchkit's bugs
_WRITE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EPIPE, errno.EROFS}

for module in (launch, ps, kill, top, logs):
    module.register(app)
app.add_typer(hosts.hosts_app, name="hosts")


def main(argv: list[str] | None = None) -> None:
    """Entry point: user errors become one message and an exit code, never a traceback.
    (typer/click already turn bad flags into a usage message and exit code 2.)"""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        if getattr(sys, name) is None:  # started with it closed: its output goes nowhere, not into a file
            null = os.open(os.devnull, os.O_WRONLY)  # that would take its number
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            setattr(sys, name, open(fd, "w", closefd=False))  # noqa: SIM115
    stdout = sys.stdout
    try:
        app(args=argv, prog_name="launchkit")
    except SystemExit as exc:
        if exc.code in (0, None) and refusal(sys.stdout.buffer) is not None:
            sys.exit(EXIT_IO)  # the job succeeded, but its output could not be written (said then)
        if exc.code == 1 and sys.stdout is not stdout:  # typer's answer to EPIPE (`| head` went away):
            sys.exit(EXIT_IO)  # stdout wrapped to pacify its last flush, and a silent exit 1
        raise
    except LaunchkitError as exc:
        try:
            Ui().error(exc.message)
        except OSError as refused:  # stderr on a full disk: as any write of ours that is refused
            if refused.errno not in _WRITE_ERRORS:
                raise
            _cannot_write(refused)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(EXIT_SIGINT)
    except Exception as exc:
        if os.environ.get("LAUNCHKIT_DEBUG"):
            raise
        if isinstance(exc, OSError) and exc.errno in _WRITE_ERRORS:
            _cannot_write(exc)
        Ui().error(f"internal error: {type(exc).__name__}: {exc} (set LAUNCHKIT_DEBUG=1 for a traceback)")
        sys.exit(EXIT_INTERNAL)


def run() -> NoReturn:
    """The process's entry point (``python -m launchkit``, the ``launchkit`` script): ``main``,
    then the exit at once. Python's teardown of the interpreter (every module's objects, freed
    one by one: paramiko's, rich's, the job's) took 0.3-0.6 s after each command on a loaded
    2-core machine, and 1 s after an ssh job's Ctrl-C, between "every process ended" and the
    shell's prompt. The exit handlers still run (``atexit``) and the output is flushed; only that
    teardown, which changes nothing outside this process, is skipped. (``main`` itself raises
    SystemExit: the in-process tests call it.)"""
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exit_status(exc.code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # (said already where it mattered: main's write checks)
            code = code or EXIT_IO
    os._exit(code)


def exit_status(code: object) -> int:
    """The status Python gives ``SystemExit(code)``: None is 0, a number itself, anything else
    is printed to stderr and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(OSError, ValueError):
        print(code, file=sys.stderr)
    return 1


def _cannot_write(exc: OSError) -> NoReturn:
    """A write the machine refused (a full disk, a closed pipe): say so once, exit 74."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # what is left in it can never be written: let it go
            with contextlib.suppress(OSError, ValueError):
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, stream.fileno())
                os.close(null)
    with contextlib.suppress(OSError, ValueError):
        Ui().error(f"cannot write{f' {exc.filename}' if exc.filename else ''}: {exc.strerror}")
    sys.exit(EXIT_IO)
