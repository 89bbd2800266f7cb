"""A plain torch.distributed script (gloo, env://) under ``launchkit launch -s 0`` over ssh (the
loopback sshd, twice in the hostfile: two hosts to the launcher, one filesystem, so this machine's
python with torch runs there): MASTER_ADDR and MASTER_PORT come from worker 0's host."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.launchkit.noserver import PROG
from tests.launchkit.procs import parse_prefixed, run

pytestmark = pytest.mark.timeout(120)


def test_a_plain_torch_script_runs_unchanged_over_ssh(sshd_loopback, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"{sshd_loopback.hostfile_line()}\n{sshd_loopback.hostfile_line()}\n")
    res = run(
        [
            "launch",
            "-H",
            str(hostfile),
            "-i",
            str(sshd_loopback.identity),
            "--known-hosts",
            str(tmp_path / "known"),
            "-n",
            "2",
            "-s",
            "0",
            sys.executable,
            PROG,
            "torch",
        ],
        cwd=tmp_path,
        timeout=100,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    outs = parse_prefixed(res.stdout)
    assert {k: (o["rank"], o["size"], o["sum"]) for k, o in outs.items()} == {
        ("worker", 0): (0, 2, [3.0] * 3),
        ("worker", 1): (1, 2, [3.0] * 3),
    }
