"""The one place that writes to the terminal.

Library code never prints: it returns values or raises ``LaunchkitError``; the CLI and the
supervisor call the helpers here. Messages go to stderr (so a job's own stdout stays clean
for pipes); the job's merged output goes to stdout/stderr through ``OutputWriter``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import threading
from collections.abc import Iterable, Sequence
from typing import Any, BinaryIO, TextIO, cast

from rich.console import Console
from rich.table import Table
from rich.text import Text

from launchkit.errors import EXIT_IO
from launchkit.merger import REPORT_LINE, printable


def _no_color() -> bool:
    return "NO_COLOR" in os.environ or os.environ.get("TERM") == "dumb"


def _cannot_draw() -> bool:
    """A terminal that cannot move its cursor (``TERM=dumb``, as rich reads it): it gets what a
    pipe gets (the plain merged output, no dashboard), at its own width."""
    return os.environ.get("TERM") in ("dumb", "unknown")


def _isatty(f: object) -> bool:
    try:
        return bool(f.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError):
        return False


class _Stderr(io.TextIOBase):
    """``sys.stderr`` as it is at each write. While the dashboard (a rich live view) is shown on
    the terminal, ``sys.stderr`` is rich's proxy, which prints a message above the view; rich's
    own stderr console would bypass it and write over the view (the message was then erased by the
    next frame and the view's top lines left behind). A stderr that is not a terminal (``2>file``)
    is written directly."""

    @staticmethod
    def _target() -> TextIO:
        current = sys.stderr
        real: TextIO = getattr(current, "rich_proxied_file", current)
        return current if _isatty(real) else real

    def write(self, text: str) -> int:
        return self._target().write(text)

    def flush(self) -> None:
        self._target().flush()

    def isatty(self) -> bool:
        return _isatty(self._target())

    def fileno(self) -> int:
        return self._target().fileno()


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """A reader that went away (``| head``): nothing more is written there (its descriptor
        points at /dev/null), and the command exits 74 as docs/exit-codes.md says, without a
        word (rich's own answer was a silent exit 1, and it nulled stdout whichever had failed)."""
        self.quiet = True
        with contextlib.suppress(AttributeError, ValueError, OSError, io.UnsupportedOperation):
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, self.file.fileno())
            finally:
                os.close(null)
        raise SystemExit(EXIT_IO)


class Ui:
    """Holds the consoles; one per CLI invocation, passed down (no global singleton)."""

    def __init__(self, out: Console | None = None, err: Console | None = None) -> None:
        # ``out.is_terminal``: a terminal that the dashboard (a live view) can be drawn on
        plain = _cannot_draw()
        self.out = out or _Console(
            no_color=_no_color(), soft_wrap=True, highlight=False, force_terminal=False if plain else None
        )
        self.err = err or _Console(
            file=cast(TextIO, _Stderr()), no_color=_no_color(), soft_wrap=True, highlight=False
        )
        if not self.out.is_terminal and not (out is None and plain and _isatty(sys.stdout)):
            self.out.width = max(self.out.width, 200)  # pipes and files: never truncate ids or paths

    def why_no_view(self) -> str:
        """Why a live view (the dashboard) is not drawn on ``out``, once ``out.is_terminal`` said no:
        a terminal that cannot draw it, or none at all."""
        if _cannot_draw() and _isatty(sys.stdout):
            return (
                f"cannot be drawn on this terminal (TERM={os.environ.get('TERM')}: it cannot move its cursor)"
            )
        return "needs a terminal (stdout is not one)"

    # -- messages -------------------------------------------------------------------------
    def info(self, message: str) -> None:
        self.err.print(f"[bold cyan]launchkit[/]: {message}", markup=True)

    def warn(self, message: str) -> None:
        # one print, one write: above the dashboard, a part without its newline is a line of its own
        self.err.print(Text.assemble(("launchkit: warning: ", "bold yellow"), message))

    def error(self, message: str) -> None:
        self.err.print(Text.assemble(("launchkit: error: ", "bold red"), message))

    def lines(self, lines: Iterable[str], style: str = "dim") -> None:
        """Lines of a report (a process's last lines): control characters escaped, long lines cut."""
        for line in lines:
            self.err.print(f"    {printable(line, REPORT_LINE + 40)}", style=style, markup=False)

    # -- structured output (stdout) ---------------------------------------------------------
    def table(self, title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
        t = Table(title=title, title_justify="left", show_edge=False, header_style="bold")
        for c in columns:
            t.add_column(c)
        for row in rows:
            t.add_row(*("" if v is None else str(v) for v in row))
        self.out.print(t)

    def json(self, data: Any) -> None:
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
        sys.stdout.flush()

    def text(self, message: str) -> None:
        self.out.print(message, markup=False)


def refused(target: BinaryIO, stream: str, exc: OSError) -> None:
    """The job's merged output could not be written to ``target`` (a full disk, EIO, a reader
    that went away): said once on stderr (unless stderr is what failed, or only a pipe's reader
    left), noted on the stream (``REFUSED``: the launch then exits 74 if the job succeeds, as
    ``launchkit.cli.main`` reads it), and the stream's descriptor pointed at /dev/null, so that
    what is left in its buffer is dropped instead of failing again when the launcher exits. The
    job goes on: its output is still kept for ``launchkit logs`` and ``--log-dir``."""
    with contextlib.suppress(AttributeError, TypeError):
        setattr(target, REFUSED, exc)
    with contextlib.suppress(AttributeError, ValueError, OSError, io.UnsupportedOperation):
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, target.fileno())
        finally:
            os.close(null)
    if stream == "out" and not isinstance(exc, BrokenPipeError):
        with contextlib.suppress(OSError, ValueError):
            Ui().error(
                f"cannot write the job's output to stdout: {exc.strerror or exc}; the job goes on "
                "(launchkit logs has its output), exit 74 if it succeeds"
            )


def refusal(target: object) -> OSError | None:
    """The error a stream refused the job's output with (``refused``), if it did."""
    error = getattr(target, REFUSED, None)
    return error if isinstance(error, OSError) else None


REFUSED = "launchkit_refused"
_ROLE_COLORS = {"scheduler": "35", "server": "34", "worker": "32"}


class OutputWriter:
    """Merges the output of many processes, each line prefixed ``[role rank]``.

    Lines are written as bytes (no decoding, no markup), complete lines only, so lines never
    interleave; stdout lines go to stdout and stderr lines to stderr. ``add`` prefixes a block
    of complete lines at once, ``flush`` writes everything added since in one call per target.
    """

    def __init__(self, stdout: BinaryIO | None = None, stderr: BinaryIO | None = None) -> None:
        self._out = stdout or sys.stdout.buffer
        self._err = stderr or sys.stderr.buffer
        self._lock = threading.Lock()
        self._color = {
            "out": not _no_color() and self._isatty(self._out),
            "err": not _no_color() and self._isatty(self._err),
        }
        self._pending: dict[str, list[bytes]] = {"out": [], "err": []}
        self._broken: set[str] = set()

    @staticmethod
    def _isatty(f: BinaryIO) -> bool:
        try:
            return f.isatty()
        except (AttributeError, ValueError):
            return False

    def prefix(self, role: str, rank: int, stream: str) -> bytes:
        label = f"[{role} {rank}]"
        if self._color[stream]:
            return f"\x1b[{_ROLE_COLORS.get(role, '0')}m{label}\x1b[0m ".encode()
        return (label + " ").encode()

    def add(self, prefix: bytes, lines: bytes, stream: str) -> None:
        """Complete lines (``lines`` ends with a newline) of one process, written at ``flush``."""
        body = lines[:-1].replace(b"\n", b"\n" + prefix)
        self._pending[stream] += (prefix, body, b"\n")

    def flush(self) -> None:
        for stream, target in (("out", self._out), ("err", self._err)):
            parts = self._pending[stream]
            if not parts:
                continue
            self._pending[stream] = []
            if stream in self._broken:
                continue
            with self._lock:
                try:
                    target.write(b"".join(parts))
                    target.flush()
                except ValueError:  # closed
                    self._broken.add(stream)
                except OSError as exc:  # `| head` went away, a full disk, EIO: keep supervising
                    self._broken.add(stream)
                    refused(target, stream, exc)

    def write(self, prefix: bytes, line: bytes, stream: str) -> None:
        """One line at once (a line without its newline gets one)."""
        self.add(prefix, line if line.endswith(b"\n") else line + b"\n", stream)
        self.flush()
