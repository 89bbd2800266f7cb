"""The root typer app and the per-run ``App`` object (the console) that commands receive.

It also holds the one rule for numbers on the command line (``bound_numbers``): every numeric
option and argument of every command is finite and from 0 to ``MAX_NUMBER`` (docs/launch.md).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer

from launchkit import __version__
from launchkit.cli.coercion import Group
from launchkit.console import Ui
from launchkit.errors import UsageError


@dataclass
class App:
    ui: Ui = field(default_factory=Ui)


MAX_NUMBER = 10_000_000  # ten million: a count, or seconds (about 115 days)


# options whose numbers need a narrower range, whichever command has them
RANGES: dict[str, tuple[float, float]] = {
    "--ssh-port": (1, 65535),
    "--scheduler-port": (1, 65535),
    "--master-port": (1, 65535),
    "--gpus-per-worker": (1, 1024),
    "--interval": (0.1, MAX_NUMBER),  # top's refresh
}


def check_number(value: Any, low: float = 0, high: float = MAX_NUMBER) -> None:
    """The rule for numbers on the command line: finite and from 0 to ``MAX_NUMBER``; ``nan``,
    ``inf``, ``1e400`` or ``-1`` as a count or a number of seconds never means what was asked (a
    wait that never ends or overflows). Options narrow it further where they need to."""
    numbers = value if isinstance(value, list | tuple) else [value]
    for number in numbers:
        if not isinstance(number, int | float) or isinstance(number, bool):
            continue
        if not (math.isfinite(number) and low <= number <= high):
            raise typer.BadParameter(f"{number!r}: expected a number from {_plain(low)} to {_plain(high)}")


def path_option(flag: str, value: str | None) -> Path | None:
    """A file option taken as text: an empty one (``-H "$HOSTS"`` with the variable unset) is
    refused, naming the flag, where ``Path("")`` would have read as ``.``, the current directory;
    a leading ``~`` is the home, as ``local_path`` says."""
    if value is None:
        return None
    if not value.strip():
        raise UsageError(f"{flag} is empty (expected a file name)")
    return Path(local_path(value))


def local_path(value: str) -> str:
    """A path on this machine as the user meant it: a leading ``~`` or ``~user`` is that home, as
    the shell would have made it had the word not been quoted (``-H '~/hosts'``, ``--log-dir
    "~/logs"``), and as ``-i`` and ``--known-hosts`` always took it; not a directory named ``~``
    in the current one. A ``~user`` of no such user stays as it is."""
    return os.path.expanduser(value) if value.startswith("~") else value


def _plain(bound: float) -> str:
    return str(int(bound)) if bound == int(bound) else f"{bound:g}"


def bound_numbers(command: Any) -> None:
    """Check every numeric parameter of ``command`` and of its subcommands with ``check_number``
    once it is parsed (chained before the parameter's own callback, if it has one)."""
    for param in command.params:
        callback = param.callback
        if getattr(callback, "bounded", False):
            continue

        bounds = next((RANGES[o] for o in param.opts if o in RANGES), (0, MAX_NUMBER))

        def checked(ctx: Any, param: Any, value: Any, callback: Any = callback, bounds: Any = bounds) -> Any:
            check_number(value, *bounds)
            return value if callback is None else callback(ctx, param, value)

        checked.bounded = True  # type: ignore[attr-defined]
        param.callback = checked
    for sub in getattr(command, "commands", {}).values():
        bound_numbers(sub)


# options where "" is a value: extra engine flags, "" for none (as their default), so that
# `--mpi-args "$EXTRA"` works with EXTRA empty
EMPTY_IS_A_VALUE = frozenset({"--mpi-args", "--slurm-args", "--sge-args"})


def refuse_empty(command: Any) -> None:
    """The rule for text on the command line: an empty value (``--log-dir ""``, ``kill ""``) of
    an option or argument of ``command`` and of its subcommands is a usage error, not taken as
    if the option were not given (``--sync-dst-dir ""`` synced nothing, ``--log-dir ""`` wrote
    nothing, ``--launcher ""`` chose the default). The check sees the words as typed, before
    ``-H ""`` becomes the path ``.``. Not for ``EMPTY_IS_A_VALUE``, nor for the words of
    ``launch``'s command (an argument of the program may be empty)."""
    for param in command.params:
        process = param.process_value
        if (
            getattr(process, "refuses_empty", False)
            or param.nargs == -1
            or EMPTY_IS_A_VALUE & set(param.opts)
        ):
            continue

        leave = "; leave the option out for its default" if param.param_type_name == "option" else ""

        def checked(
            ctx: Any, value: Any, process: Any = process, leave: str = leave, param: Any = param
        ) -> Any:
            if value == "" or (isinstance(value, list | tuple) and "" in value):
                raise typer.BadParameter(f"'' is empty: expected a value{leave}")
            try:
                return process(ctx, value)
            except typer.BadParameter as exc:
                raise _naming(exc, value, param) from exc.__cause__

        checked.refuses_empty = True  # type: ignore[attr-defined]
        param.process_value = checked
    for sub in getattr(command, "commands", {}).values():
        refuse_empty(sub)


_KINDS: dict[Any, str] = {int: "a whole number", float: "a number"}


def _naming(exc: typer.BadParameter, value: Any, param: Any) -> typer.BadParameter:
    """A value that does not convert to its parameter's type, said with the value as typed and
    what was expected, as the other refusals (``'2.5': expected a whole number``), not only in
    the words of the converter ("Input should be a valid integer, unable to parse string as an
    integer", naming no value)."""
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    if not isinstance(value, str) or not str(exc.message).startswith("Input should be"):
        return exc
    expected = _KINDS.get(annotation, str(exc.message).removeprefix("Input should be ").split(",")[0])
    return typer.BadParameter(f"{value!r}: expected {expected}", ctx=exc.ctx, param=exc.param)


app = typer.Typer(
    name="launchkit",
    cls=Group,
    help="Launch and supervise distributed training jobs (a drop-in for MXNet's tools/launch.py).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"launchkit {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version."
    ),
) -> None:
    ctx.obj = App()
    bound_numbers(ctx.command)  # before the subcommand parses its arguments
    refuse_empty(ctx.command)


def get_app(ctx: typer.Context) -> App:
    obj = ctx.find_root().obj
    if not isinstance(obj, App):
        obj = App()
        ctx.find_root().obj = obj
    return obj
