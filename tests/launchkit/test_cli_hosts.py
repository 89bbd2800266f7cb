"""``launchkit hosts list``'s refusal of its arguments says what was wrong: neither a hostfile
nor an engine given is not "not both" (the same class as ``kill``'s "give a JOB_ID or --all (not
both)" said to ``kill ''``). The CLI in-process."""

from __future__ import annotations

from pathlib import Path

import pytest

from launchkit.cli import main


def cli(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    code = info.value.code
    return code if isinstance(code, int) else 0, capsys.readouterr().err


def test_neither_a_hostfile_nor_an_engine(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = cli(capsys, ["hosts", "list"])
    assert code == 2
    assert "give a hostfile (-H FILE) or an engine (--from " in err
    assert "not both" not in err


def test_both_a_hostfile_and_an_engine(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "hf").write_text("node1\n")
    code, err = cli(capsys, ["hosts", "list", "-H", str(tmp_path / "hf"), "--from", "slurm"])
    assert code == 2
    assert "), not both" in err
