"""torchrun's flags given to launch are refused (exit 2) saying what does the same here, not with
click's nearest names (issue 40: --nnodes suggested --nodes, a Slurm flag; --standalone got nothing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from launchkit.cli.torchrunflags import TORCHRUN, torchrun_hint
from tests.launchkit.procs import run


@pytest.mark.parametrize(
    ("flag", "said"),
    [
        (["--nnodes", "2"], "No such option: --nnodes; it is torchrun's: the hostfile (-H) lists the hosts"),
        (["--standalone"], "No such option: --standalone; it is torchrun's: `launchkit launch -n N -s 0"),
        (["--nproc_per_node=4"], "No such option: --nproc_per_node; it is torchrun's: the hostfile (-H)"),
        (["--master-addr", "h"], "--scheduler-ip names it"),
        (["--rdzv-endpoint", "h:29500"], "MASTER_PORT (--master-port pins the port"),
        (["--local-ranks-filter", "0"], "launchkit logs JOB --role worker --rank N"),
        (["--role", "trainer"], "--env-worker ROLE_NAME:NAME"),
    ],
)
def test_a_torchrun_flag_says_what_does_the_same(tmp_path: Path, flag: list[str], said: str) -> None:
    marker = tmp_path / "started"
    res = run(["launch", "-n", "1", "-s", "0", *flag, "sh", "-c", f"touch {marker}"], cwd=tmp_path)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert said in " ".join(res.stderr.split()) and "Possible options" not in res.stderr
    assert "docs/migrating-from-torchrun.md" in res.stderr and not marker.exists()


def test_other_unknown_flags_keep_clicks_suggestions(tmp_path: Path) -> None:
    res = run(["launch", "-n", "1", "--nodez", "2", "true"], cwd=tmp_path)
    assert res.returncode == 2 and "Possible options" in res.stderr and "torchrun" not in res.stderr


def test_the_hints_name_flags_that_exist() -> None:
    assert torchrun_hint("--nproc_per_node") == torchrun_hint("--nproc-per-node") is not None
    assert torchrun_hint("--nodes") is None
    launch_help = run(["launch", "-h"]).stdout
    for hint in TORCHRUN.values():
        for word in hint.replace("`", " ").replace("(", " ").replace(")", " ").split():
            if word.startswith("--") and word not in ("--role", "--rank"):
                assert word.rstrip(";,:") in launch_help, word
