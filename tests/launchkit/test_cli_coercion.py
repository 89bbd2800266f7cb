"""``launchkit.cli.coercion``: a value taken without typer's coercion is the value typer's
coercion makes of it, checked against typer's own processing over every parameter the commands
declare (its default, and words a user may give), so a new one is covered; what is not plain
goes through typer; a launch builds no pydantic adapter for what it was given plainly. The CLI
in-process."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import typer.main

from launchkit.cli import app as root
from launchkit.cli import main
from launchkit.cli.coercion import _COERCE, SparesCoercion, as_typer_would
from tests.launchkit.test_cli_empty import commands

#: words a user may give, for each plain type (taken as typer takes them, or left to it)
WORDS: dict[Any, list[Any]] = {
    str: ["local", "a b", "", "-", "é", "2"],
    int: ["0", "7", "007", "123456789012345", "1234567890123456", "-1", "+1", " 1", "1_0", "2.5", "x", "٣"],
    float: ["0", "5", "0.5", "007.50", "1e3", ".5", "5.", "inf", "nan", "-1", "1_0.5", "x", "2.5x"],
}


def parameters() -> list[tuple[str, str]]:
    out = []
    for name, command in commands(typer.main.get_command(root)):
        for param in command.get_params(typer.Context(command)):  # launch's engine flags included
            if not param.required:  # (a required one always goes through typer)
                out.append((name, param.name))
    return out


def find(command_name: str, param_name: str) -> tuple[Any, Any]:
    command = dict(commands(typer.main.get_command(root)))[command_name]
    params = command.get_params(typer.Context(command))
    return command, next(p for p in params if p.name == param_name)


def typer_made(command: Any, param: Any, value: Any) -> Any:
    """What typer's own processing makes of ``value`` (its refusal: the exception's type)."""
    param.callback = None  # the value only (the callback runs after, either way)
    try:
        return type(param).process_value(param, typer.Context(command), value)
    except Exception as exc:
        return type(exc)


PARAMETERS = parameters()


@pytest.mark.parametrize(("command_name", "param_name"), PARAMETERS, ids=[f"{c}:{p}" for c, p in PARAMETERS])
def test_a_value_taken_as_it_is_is_what_typer_makes_of_it(command_name: str, param_name: str) -> None:
    command, param = find(command_name, param_name)
    kind = param.type_descriptor.annotation
    values = [param.get_default(typer.Context(command)), None, *WORDS.get(kind, [])]
    if kind == list[str]:
        values += [[], (), ["a", "b"], ("a", "")]
    for value, default in [(values[0], True), *((v, False) for v in values)]:
        kept = as_typer_would(param, value, default=default)
        if kept is not _COERCE:
            made = typer_made(command, param, value)
            assert (type(kept), kept) == (type(made), made), value


def test_every_command_spares_coercion() -> None:
    """A command registered without ``cls=Command`` (or a group without ``cls=Group``) would build
    an adapter for each of its parameters again."""
    root_command = typer.main.get_command(root)
    found = [root_command, *(command for _, command in commands(root_command))]
    assert len(found) >= 11
    assert [c.name for c in found if not isinstance(c, SparesCoercion)] == []


def test_what_is_not_plain_goes_through_typer() -> None:
    _, count = find("launch", "num_servers")
    _, seconds = find("launch", "grace_period")
    _, hostfile = find("launch", "hostfile")
    _, env = find("launch", "env")
    for word in ("-1", "+1", " 1", "1_0", "2.5", "٣", "1234567890123456"):
        assert as_typer_would(count, word) is _COERCE, word
    for word in ("1e3", ".5", "5.", "inf", "x"):
        assert as_typer_would(seconds, word) is _COERCE, word
    assert as_typer_would(hostfile, "hosts") is _COERCE  # a path: typer's
    assert as_typer_would(env, "A:1") is _COERCE  # a word where a list is expected
    assert as_typer_would(count, True) is _COERCE
    _, launcher = find("launch", "launcher")
    _, extra = find("launch", "mpi_args")
    assert (as_typer_would(launcher, ""), as_typer_would(extra, "")) == (_COERCE, _COERCE)  # refused there
    assert as_typer_would(extra, "", default=True) == ""  # its default
    assert (as_typer_would(count, "007"), as_typer_would(seconds, "0.5")) == (7, 0.5)


def test_a_launch_builds_no_adapter_for_plain_values(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    adapters = pytest.importorskip("typer._adapters")  # typer's coercion (0.29)
    built: list[Any] = []
    real = adapters.try_build_adapter

    def counted(annotation: Any, parameter_info: Any) -> Any:
        built.append(annotation)
        return real(annotation, parameter_info)

    monkeypatch.setattr(adapters, "try_build_adapter", counted)
    with contextlib.suppress(SystemExit):
        main(
            [
                "launch",
                "-n",
                "2",
                "-s",
                "0",
                "--launcher",
                "local",
                "--grace-period",
                "2",
                "--dry-run",
                "true",
            ]
        )
    assert "2 processes (2 workers)" in capsys.readouterr().out
    assert built == []  # (one for each of launch's dozens of parameters before)
    with contextlib.suppress(SystemExit):
        main(["launch", "-n", "2", "-s", "-1", "--dry-run", "true"])
    assert built == [int]  # -1 is typer's (and refused)
    assert "-1" in capsys.readouterr().err
