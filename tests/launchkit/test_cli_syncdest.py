"""``launch --sync-dst-dir`` refuses /, a top-level system directory and a home itself (exit 2,
saying what and which flag insists); ``--sync-dst-dir-force`` insists. The CLI in-process, with
--dry-run: a refusal comes before the plan, an insisted destination is the processes' directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from launchkit.cli import main


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(list(args))
    out = capsys.readouterr()
    code = info.value.code
    return code if isinstance(code, int) else 0, out.out, out.err


@pytest.fixture
def hosts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LAUNCHKIT_HOME", str(tmp_path / "lkhome"))
    (tmp_path / "hf").write_text("node1\nnode2\n")
    return "hf"


def dry_run(hosts: str, *flags: str) -> list[str]:
    return ["launch", "-n", "2", "-s", "0", "-H", hosts, *flags, "--dry-run", "--json", "true"]


@pytest.mark.parametrize(
    ("dst", "what"),
    [
        ("/", "/ is the root directory"),
        ("//", "// (that is /) is the root directory"),
        ("/home/..", "/home/.. (that is /) is the root directory"),
        ("/usr", "/usr is a top-level system directory"),
        ("/usr/", "/usr/ (that is /usr) is a top-level system directory"),
        ("/usr/.", "/usr/. (that is /usr) is a top-level system directory"),
        ("/./etc", "/./etc (that is /etc) is a top-level system directory"),
        ("/lib64", "/lib64 is a top-level system directory"),
        ("/tmp", "/tmp is a top-level system directory"),
        ("~", "~ is the remote user's home itself"),
        ("~/", "~/ (that is ~) is the remote user's home itself"),
        ("$HOME", "$HOME (that is ~) is the remote user's home itself"),
        (".", ". is the remote user's home itself (a relative path is relative to it)"),
        ("..", ".. is above the remote user's home (a relative path is relative to it)"),
    ],
)
def test_a_destination_among_the_systems_or_a_homes_own_files_is_refused(
    capsys: pytest.CaptureFixture[str], hosts: str, dst: str, what: str
) -> None:
    """`--sync-dst-dir /` rsynced the working directory into / of every host (and changed its mtime)."""
    code, out, err = cli(capsys, *dry_run(hosts, "--sync-dst-dir", dst))
    assert code == 2, err
    assert err.startswith(f"launchkit: error: --sync-dst-dir {what}: "), err
    assert "--sync-dst-dir-force" in err and "Traceback" not in err and out == ""


def test_the_launchers_own_home_is_refused(
    capsys: pytest.CaptureFixture[str], hosts: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A home shared with the hosts (NFS) has the same path there."""
    monkeypatch.setenv("HOME", str(tmp_path / "me"))
    code, _, err = cli(capsys, *dry_run(hosts, "--sync-dst-dir", f"{tmp_path}/me/"))
    assert code == 2 and f"(that is {tmp_path}/me) is a home directory itself" in err, err


def test_a_hostfile_users_home_is_refused(
    capsys: pytest.CaptureFixture[str], hosts: str, tmp_path: Path
) -> None:
    (tmp_path / "hf2").write_text("alice@node1\nnode2\n")
    code, _, err = cli(capsys, *dry_run("hf2", "--sync-dst-dir", "/home/alice/"))
    assert code == 2 and "/home/alice/ (that is /home/alice) is a home directory itself" in err, err
    code, _, err = cli(capsys, *dry_run("hf2", "--sync-dst-dir", "/home/alice/job"))
    assert code == 0, err


@pytest.mark.parametrize("dst", ["/", "/usr/", "~", "."])
def test_insisting_syncs_there(capsys: pytest.CaptureFixture[str], hosts: str, dst: str) -> None:
    code, out, err = cli(capsys, *dry_run(hosts, "--sync-dst-dir", dst, "--sync-dst-dir-force"))
    assert code == 0, err
    assert {t["cwd"] for t in json.loads(out)["tasks"]} == {dst}


@pytest.mark.parametrize("dst", ["~/job", "/srv/job", "job", "/tmp/mxnet_job/"])
def test_a_directory_of_its_own_needs_no_insisting(
    capsys: pytest.CaptureFixture[str], hosts: str, dst: str
) -> None:
    code, out, err = cli(capsys, *dry_run(hosts, "--sync-dst-dir", dst))
    assert code == 0, err
    assert {t["cwd"] for t in json.loads(out)["tasks"]} == {dst}


def test_insisting_without_a_destination_is_refused(capsys: pytest.CaptureFixture[str], hosts: str) -> None:
    code, _, err = cli(capsys, *dry_run(hosts, "--sync-dst-dir-force"))
    assert code == 2
    assert "--sync-dst-dir-force insists on a --sync-dst-dir, and none was given" in err, err
    code, _, err = cli(capsys, "launch", "-n", "1", "--sync-dst-dir-force", "--dry-run", "true")
    assert code == 2 and "--sync-dst-dir-force does not apply to --launcher local" in err, err


def test_home_variables_are_not_read_here(capsys: pytest.CaptureFixture[str], hosts: str) -> None:
    """The check is of the words given: the launcher's own $HOME is not the hosts'."""
    assert os.environ.get("HOME") != "/srv/job"
    code, _, err = cli(capsys, *dry_run(hosts, "--sync-dst-dir", "$HOME/job"))
    assert code == 0, err
