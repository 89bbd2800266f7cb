"""trainer_core.torch.checkpoint through parameter servers in real jobs: ``launchkit launch -n 2
-s 2`` of ``tests/trainer_core/torch_ckjob.py`` (1-bit compression, a server-side Adam, keys split
over both servers). A job saves at step K and trains on; a NEW job (new servers, holding nothing)
resumes from the checkpoint; both end with the parameters of a job that never saved, bit for
bit. The servers' file holds what the new servers need: Adam's moments and its step counter (an
int), each part's pull residual."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the torch extra: pip install -e '.[torch]'")

from tests.trainer_core import torch_ckjob  # noqa: E402
from tests.trainer_core.markedjob import run_marked  # noqa: E402


def launch(mode: str, path: Path) -> list[dict[str, Any]]:
    """Every worker's RESULT by rank (asserts success and that nothing is left)."""
    command = [sys.executable, "tests/trainer_core/torch_ckjob.py", mode, str(path)]
    env = ("MXNET_KVSTORE_BIGARRAY_BOUND:100",)  # buckets of over 100 values are split over both servers
    rc, out = run_marked(["-n", "2", "-s", "2"], command, "TORCH_CKJOB_TEST", 90, env)
    assert rc == 0, out
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in out.splitlines() if "RESULT " in line]
    assert sorted(r["rank"] for r in results) == [0, 1], out
    return sorted(results, key=lambda r: r["rank"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_new_job_resumes_the_servers_state_bit_for_bit(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    first = launch("first", ck)
    assert json.loads(ck.read_text())["files"] == ["ck.3.rank0", "ck.3.rank1", "ck.3.server"]
    held = torch.load(tmp_path / "ck.3.server", weights_only=True)
    assert held["servers"] == 2
    state = held["state"]
    buckets = {name.split("/")[0] for name in state}
    assert len(buckets) > 1
    for b in buckets:
        assert state[f"{b}/opt/t"] == torch_ckjob.K and isinstance(state[f"{b}/opt/t"], int)
        assert {f"{b}/value", f"{b}/opt/m", f"{b}/opt/v"} <= set(state)
    assert not any("/pull/" in name for name in state)  # with a server optimizer the weights come whole
    resumed = launch("resume", ck)
    assert [r["start"] for r in resumed] == [torch_ckjob.K] * 2
    straight = launch("straight", ck)
    for got in (*first, *resumed):
        assert got["params"] == straight[0]["params"]  # JSON floats round-trip exactly
    assert straight[1]["params"] == straight[0]["params"]
