"""The command line's rules for values hold for launch's engine flags as for every other
parameter (``launchkit.cli.app``): they join launch's parameters only when it parses
(``LaunchCommand.get_params``), after the root had applied the empty-value rule, so ``--queue ''``
and ``--ssh-port ''`` were taken (or refused in the converter's words); and a value that does not
convert says the value and what was expected (``'2.5': expected a whole number``), not
"Input should be a valid integer, unable to parse string as an integer". In-process, over every
parameter the commands declare, so a new one is covered."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer.main

from launchkit.cli import app as root
from launchkit.cli import main
from launchkit.cli.app import EMPTY_IS_A_VALUE
from tests.launchkit.test_cli_empty import NEEDS, commands


def params_of(command: Any) -> list[Any]:
    return list(command.get_params(typer.Context(command)))  # launch's engine flags included


def numeric() -> list[tuple[str, str, str, list[str]]]:
    out = []
    for name, command in commands(typer.main.get_command(root)):
        options, words = NEEDS.get(name, ([], []))
        for param in params_of(command):
            kind = getattr(getattr(param, "type_descriptor", None), "annotation", None)
            if kind in (int, float) and param.param_type_name == "option" and not param.is_flag:
                expected = "a whole number" if kind is int else "a number"
                out.append(
                    (
                        name,
                        param.opts[-1],
                        expected,
                        [*name.split(), *options, param.opts[-1], "2.5x", *words],
                    )
                )
    return out


def engine_texts() -> list[tuple[str, list[str]]]:
    launch = typer.main.get_command(root).commands["launch"]  # type: ignore[attr-defined]
    own = {p.name for p in launch.params}
    return [
        (p.opts[-1], ["launch", "-n", "1", p.opts[-1], "", "true"])
        for p in params_of(launch)
        if p.name not in own and not p.is_flag and not EMPTY_IS_A_VALUE & set(p.opts)
    ]


NUMERIC, ENGINE = numeric(), engine_texts()


def cli(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    code = info.value.code
    return code if isinstance(code, int) else 0, capsys.readouterr().err


@pytest.fixture(autouse=True)
def place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LAUNCHKIT_HOME", str(tmp_path / "lkhome"))
    (tmp_path / "hf").write_text("node1\n")


def test_the_engine_flags_are_covered() -> None:
    flags = {flag for _, flag, _, _ in NUMERIC} | {flag for flag, _ in ENGINE}
    for expected in ("--ssh-port", "--queue", "--partition", "--start-timeout", "--slots", "--tail"):
        assert expected in flags


@pytest.mark.parametrize(
    ("name", "flag", "expected", "args"), NUMERIC, ids=[f"{c[0]} {c[1]}" for c in NUMERIC]
)
def test_a_value_that_is_no_number_is_named(
    capsys: pytest.CaptureFixture[str], name: str, flag: str, expected: str, args: list[str]
) -> None:
    code, err = cli(capsys, args)
    assert code == 2, err
    assert f"Invalid value for '{flag}'" in err or f"/ '{flag}'" in err, err
    assert f"'2.5x': expected {expected}" in err, err
    assert "Input should be" not in err


@pytest.mark.parametrize(("flag", "args"), ENGINE, ids=[c[0] for c in ENGINE])
def test_an_empty_engine_flag_is_refused(
    capsys: pytest.CaptureFixture[str], flag: str, args: list[str]
) -> None:
    code, err = cli(capsys, args)
    assert code == 2, err
    assert "'' is empty: expected a value; leave the option out" in err, err
