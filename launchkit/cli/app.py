"""The root typer app and the per-run ``App`` object (the console) that commands receive."""

from __future__ import annotations

from dataclasses import dataclass, field

import typer

from launchkit import __version__
from launchkit.console import Ui


@dataclass
class App:
    ui: Ui = field(default_factory=Ui)


app = typer.Typer(
    name="launchkit",
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


def get_app(ctx: typer.Context) -> App:
    obj = ctx.find_root().obj
    if not isinstance(obj, App):
        obj = App()
        ctx.find_root().obj = obj
    return obj
