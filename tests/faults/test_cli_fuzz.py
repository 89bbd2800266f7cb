"""Hostile input on the command line: property-based fuzzing of ``launchkit launch`` arguments,
``--env`` values, leading ``NAME=VALUE`` words and hostfiles (hypothesis).

Every example runs the real entry point (``launchkit.cli.main``) in this process with
``--dry-run``, so nothing is started. The property is the CLI contract: a plan (exit 0) or a
clear usage error (exit 2), never a traceback or an "internal error", whatever the input.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launchkit.cli import main
from tests.launchkit.oddhomes import odd_home

# Text with the characters that break parsers: separators, quotes, shell metacharacters,
# control bytes, non-ASCII, and the empty string.
NASTY = st.text(
    alphabet=st.sampled_from([*"aZ09_-.:=,@/ \t'\"$`;|&*?[]{}\\\x00\x01\x1b\n", "é", "漢", "\u202e"]),
    max_size=12,
)
NAMES = st.one_of(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True), NASTY)
COUNTS = st.one_of(st.integers(-3, 40), st.sampled_from(["", "x", "1.5", "-0", "99999999999999999999"]))
ENV = st.builds(lambda n, sep, v: f"{n}{sep}{v}", NAMES, st.sampled_from([":", "=", "", "::"]), NASTY)
HOST_LINE = st.one_of(
    st.builds(
        lambda ip, port, extra: f"127.0.0.{ip}{port}{extra}",
        st.integers(0, 300),
        st.sampled_from(["", ":22", ":2", ":0", ":70000", ":x"]),
        st.sampled_from(
            ["", " slots=2", " slots = 2", " max_slots=1", " slots=-1", " slots=", " bogus=1", " #c"]
        ),
    ),
    NASTY,
)

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def run_cli(argv: list[str]) -> tuple[int, str]:
    # byte buffers underneath, as a real stdout has (a launch writes its jobs' output there)
    out, err = (io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace") for _ in "12")
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    out.flush()
    err.flush()
    return code, b"".join(f.buffer.getvalue() for f in (out, err)).decode("utf-8", "backslashreplace")  # type: ignore[attr-defined]


def check(argv: list[str]) -> None:
    code, text = run_cli(argv)
    assert "Traceback" not in text and "internal error" not in text, (argv, text[-2000:])
    assert code in (0, 2), (argv, code, text[-2000:])


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAUNCHKIT_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)


@SETTINGS
@given(
    n=COUNTS,
    s=COUNTS,
    envs=st.lists(ENV, max_size=3),
    assignments=st.lists(ENV, max_size=2),
    command=st.lists(NASTY, min_size=0, max_size=3),
    launcher=st.sampled_from(["local", "ssh", "", "nosuch", "LOCAL"]),
    extra=st.lists(
        st.sampled_from(["--interface", "--scheduler-port", "--log-dir", "--p3", "-i", "--timeout"]),
        max_size=2,
    ),
    extra_value=NASTY,
)
def test_launch_arguments_give_a_plan_or_a_usage_error(
    n, s, envs, assignments, command, launcher, extra, extra_value
) -> None:
    argv = ["launch", "--dry-run", "--launcher", launcher, "-n", str(n), "-s", str(s)]
    for e in envs:
        argv += ["--env", e]
    for flag in extra:
        argv += [flag] if flag == "--p3" else [flag, extra_value]
    if launcher == "ssh":
        argv += ["-H", "hosts", "--scheduler-ip", "10.0.0.1"]  # no name lookups in a dry run
        Path("hosts").write_text("127.0.0.1\n127.0.0.2\n")
    check([*argv, *assignments, *command])


@SETTINGS
@given(lines=st.lists(HOST_LINE, min_size=0, max_size=5), n=st.integers(1, 6), s=st.integers(0, 3))
def test_hostfiles_give_a_plan_or_an_error_naming_the_line(lines, n, s) -> None:
    Path("hosts").write_text("\n".join(lines) + "\n", errors="surrogateescape")
    check(
        [
            "launch",
            "--dry-run",
            "--launcher",
            "ssh",
            "--scheduler-ip",
            "10.0.0.1",
            "-H",
            "hosts",
            "-n",
            str(n),
            "-s",
            str(s),
            "python3",
            "x.py",
        ]
    )


@pytest.mark.parametrize(
    "words",
    [["--env", "A:x\0y", "true"], ["--env-worker", "A:\0", "true"], ["B=x\0", "true"], ["true", "a\0b"]],
)
def test_a_nul_byte_in_a_variable_or_an_argument_is_a_usage_error(words: list[str]) -> None:
    """No environment variable or argument can hold a NUL: a real launch (not only a dry run) used
    to end in 'internal error: ValueError: embedded null byte' from the process start."""
    code, text = run_cli(["launch", "-n", "1", "-s", "0", "--launcher", "local", *words])
    assert code == 2 and "NUL byte" in text and "internal error" not in text, text


# --- the environment and the file system: every command, odd LAUNCHKIT_HOMEs, a removed working
# directory, hostfiles of every kind. The property: exit 0 or 2 with a clean message, never a
# traceback or an "internal error"; where the case is broken for that command, exit 2 naming the
# path. (`kill --all` is left out: with a usable home it would end every job of this user.)

LAUNCH = ["launch", "-n", "1", "-s", "0", "--launcher", "local", "true"]
RECORD_COMMANDS = {
    "launch": LAUNCH,
    "launch --dry-run": ["launch", "--dry-run", "-n", "1", "-s", "0", "true"],
    "ps": ["ps", "--all"],
    "kill": ["kill", "1127-000000-abcdef"],
    "logs": ["logs", "1127-000000-abcdef"],
    "top": ["top", "1127-000000-abcdef", "--once"],
    "hosts list": ["hosts", "list", "-H", "hosts"],
    "hosts add": ["hosts", "add", "node9", "-H", "hosts"],
    "hosts remove": ["hosts", "remove", "node1", "-H", "hosts"],
}


def _odd_environment(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str | None:
    """Set up ``case``; return the path the refusals must name (None: nothing is wrong)."""
    Path("hosts").write_text("node1\nnode2\n")
    kind = ODD_HOMES.get(case)
    if kind is not None:
        home = odd_home(kind, tmp_path)
        if kind == "jobs is a file":
            home = home / "jobs"
    elif case == "home is not UTF-8":
        home = Path(os.fsdecode(bytes(tmp_path) + b"/h\xffome"))
    elif case == "cwd removed":
        gone = tmp_path / "gone"
        gone.mkdir()
        monkeypatch.chdir(gone)
        gone.rmdir()
        return "current directory"
    else:
        raise ValueError(f"unknown case {case!r}")
    monkeypatch.setenv("LAUNCHKIT_HOME", str(home))
    return None if case == "home is not UTF-8" else str(home)


ODD_HOMES = {
    "home is a file": "file",
    "home is a dangling link": "dangling link",
    "home's jobs is a file": "jobs is a file",
    "home cannot be made": "not creatable",
}

# which commands each case must refuse (the others may run: exit 0, or 2 for the made-up job id)
REFUSED = {
    "home is a file": {"launch", "ps", "kill", "logs", "top"},
    "home is a dangling link": {"launch", "ps", "kill", "logs", "top"},
    "home's jobs is a file": {"launch", "ps", "kill", "logs", "top"},
    "home cannot be made": {"launch"},
    "home is not UTF-8": set(),
    "cwd removed": {
        "launch",
        "launch --dry-run",
        "hosts list",
        "hosts add",
        "hosts remove",
    },  # hosts: a relative -H
}


@pytest.mark.parametrize(
    "command",
    # a launch that is not refused runs its job (tests/tiers.py)
    [pytest.param(c, marks=pytest.mark.proc) if c == "launch" else c for c in RECORD_COMMANDS],
)
@pytest.mark.parametrize("case", list(REFUSED))
def test_every_command_in_an_odd_environment_runs_or_says_why(
    case: str, command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LAUNCHKIT_HOME=/some/file ran the job and ended in 'internal error: NotADirectoryError';
    a launch from a removed directory in 'internal error: FileNotFoundError'."""
    named = _odd_environment(case, tmp_path, monkeypatch)
    code, text = run_cli(RECORD_COMMANDS[command])
    assert "Traceback" not in text and "internal error" not in text, text[-2000:]
    if command in REFUSED[case]:
        assert code == 2 and named is not None and named in text, (code, text[-2000:])
    else:
        assert code in (0, 2), (code, text[-2000:])


def _hostfile(kind: str, tmp_path: Path) -> Path:
    """A path given as -H of ``kind``."""
    path = tmp_path / kind.replace(" ", "-")
    if kind == "directory":
        path.mkdir()
    elif kind == "missing parent":
        path = tmp_path / "no" / "such" / "hosts"
    elif kind == "not UTF-8":
        path.write_bytes(b"node1\n\xc3\x28\n")
    elif kind == "dangling link":
        path.symlink_to(tmp_path / "nowhere")
    elif kind == "link loop":
        path.symlink_to(path)
    elif kind == "unreadable":
        path = Path("/proc/self/mem")  # EIO, for root too
    elif kind == "empty":
        path.write_text("")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "a link to a good file":
        (tmp_path / "good").write_text("node1\n")
        path.symlink_to(tmp_path / "good")
    elif kind == "a name that is not UTF-8":
        path = Path(os.fsdecode(bytes(tmp_path) + b"/h\xffosts"))
        path.write_text("node1\n")
    return path


BAD_HOSTFILES = [
    "directory",
    "missing parent",
    "not UTF-8",
    "dangling link",
    "link loop",
    "unreadable",
    "empty",
]
GOOD_HOSTFILES = ["a link to a good file", "a name that is not UTF-8"]
HOSTFILE_COMMANDS = {  # -H FILE goes after these words
    "launch": ["launch", "-n", "1", "-s", "0", "--scheduler-ip", "10.0.0.1"],
    "launch --dry-run": ["launch", "--dry-run", "-n", "1", "-s", "0", "--scheduler-ip", "10.0.0.1"],
    "hosts list": ["hosts", "list"],
    "hosts add": ["hosts", "add", "node9"],
    "hosts remove": ["hosts", "remove", "node1"],
    "hosts check": ["hosts", "check", "--connect-timeout", "1"],
}
# what a good file may still do: a launch or a check would contact the (made-up) hosts
ONLY_FOR_BAD = {"launch", "hosts check"}


@pytest.mark.parametrize("command", list(HOSTFILE_COMMANDS))
@pytest.mark.parametrize("kind", BAD_HOSTFILES + GOOD_HOSTFILES + ["fifo"])
def test_every_hostfile_command_on_every_kind_of_file(kind: str, command: str, tmp_path: Path) -> None:
    """hosts add on a directory, under a missing directory and on a non-UTF-8 file ended in
    'internal error' (exit 1) while hosts list said what was wrong (exit 2)."""
    if kind in GOOD_HOSTFILES and command in ONLY_FOR_BAD:
        pytest.skip("would contact the hosts")
    if kind == "fifo" and command not in ("hosts add", "hosts remove"):
        pytest.skip("reading a fifo waits for a writer, as cat does (a pipe is a fine hostfile: -H <(...))")
    if kind in ("dangling link", "empty") and command == "hosts add":
        kind = "missing parent"  # hosts add starts a file there (as `echo >> link` would); not in a missing directory
    path = _hostfile(kind, tmp_path)
    before = sorted(tmp_path.iterdir())
    code, text = run_cli(
        [*HOSTFILE_COMMANDS[command], "-H", str(path), *(["true"] if "launch" in command else [])]
    )
    assert "Traceback" not in text and "internal error" not in text, text[-2000:]
    if kind in GOOD_HOSTFILES:
        assert code == 0, text[-2000:]
    else:
        assert code == 2 and str(path) in text, (code, text[-2000:])
        assert sorted(tmp_path.iterdir()) == before  # nothing written, nothing left behind
