"""Horovod's tensor fusion in real jobs (``launchkit launch -n N -s 0 --launcher local``):
``tests/trainer_core/torch_fusionjob.py`` submits many small named ``allreduce_async``s (sizes and
dtypes vary, the last rank in reverse order) under ``HOROVOD_FUSION_THRESHOLD`` and
``HOROVOD_CYCLE_TIME``; fused, the results are the unfused ones bit for bit, in fewer collectives;
threshold 0 runs one collective per tensor; a mismatch inside a batch fails that operation on
every rank and the group goes on; the timeline shows each fused batch."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch", reason="trainer_core.torch needs torch (the torch extra)")

from tests.trainer_core.markedjob import run_marked
from tests.trainer_core.torch_fusionjob import COUNT, DTYPES, average, tensor_input


def launch(workers: int, env: list[str]) -> list[dict[str, Any]]:
    rc, out = run_marked(
        ["-n", str(workers), "-s", "0"],
        [sys.executable, "tests/trainer_core/torch_fusionjob.py"],
        "TORCH_FUSION_JOB_TEST",
        180,
        env=env,
    )
    assert rc == 0, out
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in out.splitlines() if "RESULT " in line]
    assert sorted(r["rank"] for r in results) == list(range(workers)), out
    return sorted(results, key=lambda r: r["rank"])


def decoded(res: dict[str, Any], i: int) -> np.ndarray:
    return np.frombuffer(bytes.fromhex(res["results"][i]), res["dtypes"][i])


@pytest.mark.parametrize("workers", [2, 3])
def test_fusion_gives_the_unfused_results_in_fewer_collectives(workers: int, tmp_path: Path) -> None:
    trace = tmp_path / "timeline.json"
    # a long cycle: each rank's batch closes when it synchronizes (it submitted everything by then)
    fused = launch(workers, ["HOROVOD_CYCLE_TIME:5000", f"HOROVOD_TIMELINE:{trace}"])
    alone = launch(workers, ["HOROVOD_FUSION_THRESHOLD:0", "HOROVOD_CYCLE_TIME:5000"])
    keys = {(DTYPES[i % len(DTYPES)], average(i)) for i in range(COUNT)}
    assert [r["ran"] for r in alone] == [COUNT] * workers  # one collective per tensor
    assert all(r["ran"] <= len(keys) < COUNT for r in fused), [r["ran"] for r in fused]
    for r in range(workers):
        assert fused[r]["results"] == alone[r]["results"]  # bit for bit
        assert fused[r]["results"] == fused[0]["results"]  # and the same on every rank
    for i in range(COUNT):
        x = decoded(fused[0], i)
        total = np.sum([tensor_input(i, r).astype(np.float64) for r in range(workers)], axis=0)
        want = total / workers if average(i) else total
        if x.dtype.kind == "i":  # Horovod's integer Average: the sum times 1/size, truncated
            want = np.trunc(total * (1.0 / workers)) if average(i) else total
            assert x.tolist() == want.astype(np.int64).tolist(), i
        else:
            assert np.allclose(
                x,
                want,
                rtol=1e-2 if x.dtype == np.float16 else 1e-5,
                atol=1.0 if x.dtype == np.float16 else 1e-6,
            ), i
    for res in (*fused, *alone):
        assert res["grouped"] == [[float(workers * k + sum(range(workers)))] * (k + 1) for k in range(5)]
        assert res["inplace"] == [[float(sum(range(workers)))] * 3] * 4
        assert res["ok"] == [[float(workers)] * 4] * 3 and res["after"] == [float(workers)] * 2
        assert "'bad'" in res["bad"] and "different shapes" in res["bad"], res["bad"]
    events = json.loads(trace.read_text())
    batches = [e for e in events if e.get("name") == "MEMCPY_IN_FUSION_BUFFER"]
    ours = [e for e in batches if all(n.startswith("t") for n in e["args"]["tensors"])]  # the 40's
    carried = {name for e in ours for name in e["args"]["tensors"]}
    assert 0 < len(ours) <= fused[0]["ran"] and {f"t{i}" for i in range(COUNT)} <= carried, ours
    assert any({"ok0", "ok1", "ok2"} <= set(e["args"]["tensors"]) for e in batches)  # "bad" left out
    assert not any("bad" in e["args"]["tensors"] for e in batches)
    assert all(len(e["args"]["tensors"]) > 1 and e["args"]["rank"] == 0 for e in batches)


def test_bad_fusion_settings_are_a_clear_error_at_init() -> None:
    rc, out = run_marked(
        ["-n", "2", "-s", "0"],
        [sys.executable, "tests/trainer_core/torch_fusionjob.py"],
        "TORCH_FUSION_JOB_TEST",
        120,
        env=["HOROVOD_FUSION_THRESHOLD:64MB"],
    )
    assert rc != 0
    assert "HOROVOD_FUSION_THRESHOLD must be a whole number of bytes" in out and "'64MB'" in out, out
