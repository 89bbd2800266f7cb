"""A path on this machine given with a leading ``~`` in quotes (``-H '~/hosts'``, ``--log-dir
"~/logs"``), where no shell made it the home, is the home all the same, for every command
(``launchkit.cli.app.local_path``), as ``-i`` and ``--known-hosts`` always took it: ``-H``
said "no such file" of a file that was there, and ``--log-dir`` made a directory named ``~`` in
the current one and wrote the logs there. The CLI in-process."""

from __future__ import annotations

from pathlib import Path

import pytest

from launchkit.cli import main
from launchkit.cli.app import local_path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launchkit_home: Path) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "hf").write_text("node1\nnode2 slots=2\n")
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    return tmp_path / "home"


def cli(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    code = info.value.code
    out = capsys.readouterr()
    return code if isinstance(code, int) else 0, out.out, out.err


@pytest.mark.parametrize(
    "args",
    [
        ["hosts", "list", "-H", "~/hf"],
        ["launch", "-n", "2", "-H", "~/hf", "--dry-run", "true"],
        ["launch", "-n", "2", "--hostfile", "~/hf", "--launcher", "mpi", "--dry-run", "true"],
    ],
    ids=["hosts list", "launch ssh", "launch mpi"],
)
@pytest.mark.proc  # launch mpi's dry run asks mpirun --version
def test_a_quoted_tilde_hostfile_is_read_from_the_home(
    capsys: pytest.CaptureFixture[str], home: Path, args: list[str]
) -> None:
    code, out, err = cli(capsys, args)
    assert code == 0, err
    assert "node2" in out


def test_hosts_add_writes_into_the_home(capsys: pytest.CaptureFixture[str], home: Path) -> None:
    code, _out, err = cli(capsys, ["hosts", "add", "-H", "~/new", "node7"])
    assert code == 0, err
    assert (home / "new").read_text() == "node7\n"
    assert not Path("~").exists()


@pytest.mark.proc  # a local job runs (and its reaper)
def test_a_quoted_tilde_log_dir_is_in_the_home(capsys: pytest.CaptureFixture[str], home: Path) -> None:
    code, _out, err = cli(
        capsys, ["launch", "-n", "1", "-s", "0", "--launcher", "local", "--log-dir", "~/logs", "echo", "hi"]
    )
    assert code == 0, err
    assert (home / "logs" / "worker-0.stdout").read_bytes() == b"hi\n"
    assert not Path("~").exists()  # before: ./~/logs in the current directory


def test_only_a_leading_tilde_is_the_home(home: Path) -> None:
    assert local_path("~") == str(home)
    assert local_path("~/a b/ü") == f"{home}/a b/ü"
    assert local_path("a/~/b") == "a/~/b"
    assert local_path("~no-such-user-here/x") == "~no-such-user-here/x"  # stays: no such home
