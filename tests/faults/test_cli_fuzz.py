"""Hostile input on the command line: property-based fuzzing of ``launchkit launch`` arguments,
``--env`` values, leading ``NAME=VALUE`` words and hostfiles (hypothesis).

Every example runs the real entry point (``launchkit.cli.main``) in this process with
``--dry-run``, so nothing is started. The property is the CLI contract: a plan (exit 0) or a
clear usage error (exit 2), never a traceback or an "internal error", whatever the input.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launchkit.cli import main

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
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    return code, out.getvalue() + err.getvalue()


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
    check(["launch", "--dry-run", "--launcher", "ssh", "--scheduler-ip", "10.0.0.1", "-H", "hosts",
           "-n", str(n), "-s", str(s), "python3", "x.py"])  # fmt: skip


@pytest.mark.parametrize(
    "words",
    [["--env", "A:x\0y", "true"], ["--env-worker", "A:\0", "true"], ["B=x\0", "true"], ["true", "a\0b"]],
)
def test_a_nul_byte_in_a_variable_or_an_argument_is_a_usage_error(words: list[str]) -> None:
    """No environment variable or argument can hold a NUL: a real launch (not only a dry run) used
    to end in 'internal error: ValueError: embedded null byte' from the process start."""
    code, text = run_cli(["launch", "-n", "1", "-s", "0", "--launcher", "local", *words])
    assert code == 2 and "NUL byte" in text and "internal error" not in text, text
