"""An empty value of any option or argument of any command is refused (exit 2), not taken as if
the option were not given (``--sync-dst-dir ""`` synced nothing, ``--log-dir ""`` wrote nothing,
``--launcher ""`` chose the default, ``kill ""`` asked for a job id or --all): the rule of
``launchkit.cli.app.refuse_empty``, checked here over every parameter the commands declare, so a
new one is covered. The CLI in-process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer.main

from launchkit.cli import app as root
from launchkit.cli import main
from launchkit.cli.app import EMPTY_IS_A_VALUE

# the options and the positional words each command needs besides the one under test (so that
# only it can be refused)
NEEDS: dict[str, tuple[list[str], list[str]]] = {
    "launch": (["-n", "1"], ["true"]),
    "kill": (["--all"], []),
    "top": ([], ["x"]),
    "logs": ([], ["x"]),
    "ps": ([], []),
    "hosts add": (["-H", "hf"], ["node9"]),
    "hosts remove": (["-H", "hf"], ["node9"]),
    "hosts check": (["-H", "hf"], []),
    "hosts list": (["-H", "hf"], []),
}


def commands(command: Any = None, path: tuple[str, ...] = ()) -> list[tuple[str, Any]]:
    command = command or typer.main.get_command(root)
    found = [(" ".join(path), command)] if path else []
    for name, sub in getattr(command, "commands", {}).items():
        found += commands(sub, (*path, name))
    return found


def cases() -> list[tuple[str, str, list[str]]]:
    """(command, parameter, argv) for every option that takes a value and every argument."""
    out = []
    for name, command in commands():
        options, words = NEEDS.get(name, ([], []))
        for param in command.params:
            if (
                param.param_type_name == "option"
                and not param.is_flag
                and not EMPTY_IS_A_VALUE & set(param.opts)
            ):
                out.append((name, param.opts[-1], [*name.split(), *options, param.opts[-1], "", *words]))
            elif param.param_type_name == "argument" and param.nargs == 1:
                out.append((name, param.name, [*name.split(), *options, ""]))
    return out


CASES = cases()


def cli(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    code = info.value.code
    return code if isinstance(code, int) else 0, capsys.readouterr().err


@pytest.fixture(autouse=True)
def place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LAUNCHKIT_HOME", str(tmp_path / "lkhome"))
    (tmp_path / "hf").write_text("node1\n")
    return tmp_path


def test_every_command_and_text_option_is_covered() -> None:
    names = {(name, flag) for name, flag, _ in CASES}
    for expected in [("launch", "--sync-dst-dir"), ("launch", "--log-dir"), ("launch", "--launcher")]:
        assert expected in names
    assert ("kill", "job_id") in names and ("hosts add", "host") in names
    assert {name for name, _, _ in CASES} == set(NEEDS)


@pytest.mark.parametrize(("name", "param", "args"), CASES, ids=[f"{c[0]} {c[1]}" for c in CASES])
def test_an_empty_value_is_refused(
    capsys: pytest.CaptureFixture[str], place: Path, name: str, param: str, args: list[str]
) -> None:
    code, err = cli(capsys, args)
    assert code == 2, err
    assert "'' is empty: expected a value" in err, err
    assert "Traceback" not in err
    assert (place / "hf").read_text() == "node1\n"


def test_an_empty_option_says_to_leave_it_out(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = cli(capsys, ["launch", "-n", "1", "--log-dir", "", "true"])
    assert code == 2
    assert "Invalid value for '--log-dir': '' is empty: expected a value; leave the option out" in err


@pytest.mark.proc  # the mpi backend's dry run asks mpirun --version
@pytest.mark.parametrize("flag", sorted(EMPTY_IS_A_VALUE))
def test_extra_engine_flags_may_be_empty(capsys: pytest.CaptureFixture[str], flag: str) -> None:
    """``--mpi-args "$EXTRA"`` with EXTRA empty: no extra flags, as the default."""
    launcher = {"--mpi-args": "mpi", "--slurm-args": "slurm", "--sge-args": "sge"}[flag]
    code, err = cli(
        capsys, ["launch", "-n", "1", "-s", "0", "--launcher", launcher, flag, "", "--dry-run", "true"]
    )
    assert code == 0 and "is empty" not in err, err


def test_the_commands_words_may_be_empty(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = cli(capsys, ["launch", "-n", "1", "-s", "0", "--dry-run", "python3", "-c", ""])
    assert code == 0, err
