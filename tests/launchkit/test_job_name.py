"""The job's name is shown by ``ps``, the dashboard and every message of the launch, so it never
holds a control character: ``--job-name`` with one (a newline, an escape sequence) is refused
(exit 2; before, ``--job-name $'\\e[2J'`` cleared the screen of whoever ran ``ps``, and a newline
split its row in two), and a name made from a script's name escapes them
(``launchspec.build_spec``, ``plan.default_job_name``). In-process."""

from __future__ import annotations

import pytest

from launchkit.cli import main
from launchkit.core.plan import default_job_name


def cli(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    code = info.value.code
    out = capsys.readouterr()
    return code if isinstance(code, int) else 0, out.out, out.err


@pytest.mark.parametrize("name", ["a\nb", "x\x1b[31mred", "tab\there", "bell\x07", "del\x7f"])
def test_a_job_name_with_a_control_character_is_refused(
    capsys: pytest.CaptureFixture[str], launchkit_home: object, name: str
) -> None:
    code, out, err = cli(capsys, ["launch", "-n", "1", "-s", "0", "--job-name", name, "--dry-run", "true"])
    assert code == 2, out
    assert f"--job-name {name!r} holds a control character" in err
    assert name not in out + err  # said escaped, never as it is


@pytest.mark.parametrize("name", ["train", "mein Lauf ü", "日本語", "a-b.c_d"])
def test_a_printable_job_name_is_taken(
    capsys: pytest.CaptureFixture[str], launchkit_home: object, name: str
) -> None:
    code, out, err = cli(capsys, ["launch", "-n", "1", "-s", "0", "--job-name", name, "--dry-run", "true"])
    assert code == 0, err
    assert f"job {name} (" in out


def test_a_name_made_from_the_command_escapes_control_characters() -> None:
    assert default_job_name(["python", "/x/tr\x1b[2Jain.py"]) == "tr\\x1b[2Jain"
    assert default_job_name(["./a\x07b", "x"]) == "a\\x07b"
    assert default_job_name(["python", "train.py", "--lr", "0.1"]) == "train"
    assert default_job_name(["sh -c 'echo hi'"]) == "sh"
