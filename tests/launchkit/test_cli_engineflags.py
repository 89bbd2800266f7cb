"""The engine flags of ``launchkit launch`` come from the backends' declarations
(``Capabilities.flags``, ``core.flags.EngineFlag``), declared once next to each backend: the
option, its group in the help, its refusal for a backend that does not take it and the value the
backend's options get. A new backend with a flag of its own is its module and one registry line
(``knobbackend``), run here as the real CLI in a subprocess with that line added."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launchkit import backends
from launchkit.cli import backendflags, launchoptions
from launchkit.core.capabilities import Capabilities
from launchkit.core.flags import EngineFlag
from launchkit.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
# the CLI with one more registry line, before the command line is built from the registry
WITH_KNOB = (
    "from launchkit import backends; "
    "backends.REGISTRY['knob'] = 'tests.launchkit.knobbackend:KnobBackend'; "
    "from launchkit.cli import main; main()"
)


def cli(*args: str, knob: bool = True) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", WITH_KNOB] if knob else [sys.executable, "-m", "launchkit"]
    env = {"PYTHONPATH": str(ROOT), "NO_COLOR": "1", "COLUMNS": "100", "PATH": "/usr/bin:/bin"}
    return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)


def test_a_new_backends_flag_is_in_the_help_reaches_it_and_is_refused_elsewhere() -> None:
    help_text = cli("launch", "--help").stdout
    assert (
        "Options for --launcher knob:\n  --knob <int>  How far to turn the knob.  [default: 1]" in help_text
    )
    assert "local, ssh, mpi, sge, slurm, yarn or knob (default" in " ".join(help_text.split())
    res = cli("launch", "--dry-run", "--json", "-n", "1", "--launcher", "knob", "--knob", "7", "true")
    assert res.returncode == 0, res.stderr
    assert "the knob is at 7" in json.loads(res.stdout)["notes"]  # the flag reached its options
    res = cli("launch", "--dry-run", "--json", "-n", "1", "--launcher", "knob", "true")
    assert "the knob is at 1" in json.loads(res.stdout)["notes"]  # its default
    res = cli("launch", "--dry-run", "-n", "1", "--launcher", "knob", "--knob", "0", "true")
    assert res.returncode == 2 and "--knob must be at least 1, got 0" in res.stderr, res.stderr
    res = cli("launch", "--dry-run", "-n", "1", "--launcher", "local", "--knob", "7", "true")
    assert res.returncode == 2, res.stderr
    assert "--knob does not apply to --launcher local; it is for --launcher knob" in res.stderr
    res = cli("launch", "--dry-run", "-n", "1", "--launcher", "knob", "--partition", "gpu", "true")
    assert res.returncode == 2 and "--partition does not apply to --launcher knob" in res.stderr
    assert "--knob" not in cli("launch", "--help", knob=False).stdout  # without the registry line


def test_every_engine_flag_is_in_the_help_under_the_backends_that_take_it() -> None:
    res = cli("launch", "--help", knob=False)
    sections = {s.split(":\n")[0]: s for s in res.stdout.split("\n\n") if s.startswith("Options for")}
    for flag in backends.engine_flags():
        title = f"Options for --launcher {' or '.join(backendflags.takers(flag))}"
        assert f"  {flag.label.replace('/', ', ')} " in sections[title], (title, flag.label)


def test_the_flags_have_one_declaration_and_names_of_their_own() -> None:
    engine = [f.name for f in backends.engine_flags()]
    common = [p.name for p in launchoptions.common()]
    assert len(set(engine)) == len(engine) and not set(engine) & set(common)
    other = EngineFlag("--queue", "Another queue.")
    backends.REGISTRY["other"] = f"{__name__}:OtherQueue"
    try:
        with pytest.raises(TypeError, match="backend other declares --queue unlike another backend"):
            backends.engine_flags()
    finally:
        del backends.REGISTRY["other"]
    assert other.name == "queue"


def test_a_refusal_names_the_flag_as_the_help_does() -> None:
    with pytest.raises(
        UsageError, match=r"^-i/--identity does not apply to --launcher sge; it is for --launcher ssh or mpi$"
    ):
        backendflags.refuse_unused("sge", ["identity"])
    backendflags.refuse_unused("sge", ["queue", "num_workers", "node_python"])  # taken, or no engine flag


class OtherQueue(backends.Backend):
    capabilities = Capabilities(flags=(EngineFlag("--queue", "Another queue."),))


def test_only_launch_asks_the_backends_for_their_flags(tmp_path: Path) -> None:
    """The engine flags join launch's parameters when launch parses or prints its help: the other
    commands import no backend module for declarations they do not use (fewer imports at start)."""
    probe = (
        "import sys\nfrom launchkit.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.split('.')[-1] in ('mpi', 'sge', 'slurm', 'yarn')))"
    )
    env = {"PYTHONPATH": str(ROOT), "NO_COLOR": "1", "LAUNCHKIT_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}

    def engines(*args: str) -> str:
        res = subprocess.run(
            [sys.executable, "-c", probe, *args], capture_output=True, text=True, env=env, timeout=60
        )
        return res.stdout.splitlines()[-1]

    assert engines("ps") == "[]"
    assert engines("hosts", "list", "-H", str(ROOT / "hostfiles" / "example")) == "[]"
    assert "launchkit.backends.yarn" in engines("launch", "--help")
