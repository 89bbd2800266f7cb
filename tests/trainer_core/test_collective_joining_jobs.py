"""``join`` among real worker processes of a ``-s 0`` job launched with ``launchkit launch
--launcher local`` (program: joinprog.py): rank r has ``1 + r`` batches, so the ranks join one
after another while the others go on; every result equals a numpy reference (the joined ranks'
zeros, no rows, the root's value), ``join`` returns the last rank on every rank, and a torch
training loop ends with the same parameters on every rank (its Adasum with the joined ranks' zeros
in their own places). In-process: test_collective_joining.py."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.launchkit.procs import parse_prefixed, run
from tests.trainer_core import joinprog
from tests.trainer_core.adasumref import adasum_reference

PROG = str(Path(__file__).with_name("joinprog.py"))


def launch(
    workers: int, tmp_path: Path, *args: str, launcher: str = "local", servers: int = 0
) -> dict[int, dict]:
    if launcher == "mpi" and not shutil.which("mpirun"):
        pytest.skip("mpirun is not installed (scripts/test.sh installs Open MPI)")
    res = run(
        [
            "launch",
            "-n",
            str(workers),
            "-s",
            str(servers),
            "--launcher",
            launcher,
            sys.executable,
            PROG,
            *args,
        ],
        cwd=tmp_path,
        timeout=180,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    outs = parse_prefixed(res.stdout)
    assert sorted(outs) == [("worker", r) for r in range(workers)]
    return {r: outs[("worker", r)] for r in range(workers)}


def expected(w: int, r: int) -> list[Any]:
    """What rank ``r`` of ``w`` must see, batch by batch (numpy; joined ranks give zeros)."""
    out: list[Any] = []
    for step in range(joinprog.batches(r)):
        live = [q for q in range(w) if step < joinprog.batches(q)]
        parts = np.stack(
            [joinprog.value(q, step) if q in live else np.zeros(5, np.float32) for q in range(w)]
        )
        total = parts.sum(0)
        out.append([total.tolist(), (total / w).tolist(), parts.max(0).tolist()])
        out.append(parts.astype(np.int64).sum(0).tolist())
        out.append([total.tolist(), parts[:, :2].astype(np.float64).sum(0).tolist()])
        out.append(np.concatenate([np.full((1 + q, 2), step, np.int32) for q in live]).tolist())
        out.append([float(w - 1)] * 3)
    return out


def flat(v: Any) -> list[float]:
    """The numbers of a nested list, in order."""
    return [x for item in v for x in flat(item)] if isinstance(v, list) else [float(v)]


def check(outs: dict[int, dict], w: int) -> None:
    for r, out in outs.items():
        want = expected(w, r)
        assert len(out["seen"]) == len(want), r
        for i, (got, ref) in enumerate(zip(out["seen"], want, strict=True)):
            assert len(flat(got)) == len(flat(ref)), (r, i, got, ref)
            np.testing.assert_allclose(flat(got), flat(ref), rtol=1e-6, err_msg=f"rank {r} item {i}")
        assert out["join"] == w - 1, out
        assert out["after"] == [float(sum(range(1, w + 1)))] * 2, out
    assert len({out["join2"] for out in outs.values()}) == 1


@pytest.mark.parametrize(("w", "launcher"), [(2, "local"), (3, "local"), (4, "local"), (3, "mpi")])
def test_uneven_batches_equal_a_numpy_reference_and_join_returns_the_last_rank(
    w: int, launcher: str, tmp_path: Path
) -> None:
    check(launch(w, tmp_path, "collective", launcher=launcher), w)


@pytest.mark.parametrize(("w", "force"), [(3, "ring"), (4, "recursive_doubling")])
def test_uneven_batches_with_an_algorithm_forced_off_the_segment(w: int, force: str, tmp_path: Path) -> None:
    check(launch(w, tmp_path, "collective", force), w)


def reference(w: int) -> list[float]:
    """One process's SGD over every rank's batches: a step's gradient is the sum over the ranks
    that still have data, divided by ``w`` (the joined ranks' zeros, Horovod's Average)."""
    import torch

    model = joinprog.model_at_start()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(joinprog.batches(w - 1)):
        opt.zero_grad()
        for r in range(w):
            if step < joinprog.batches(r):
                x, y = joinprog.batch(r, step)
                (torch.nn.functional.mse_loss(model(x), y) / w).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


@pytest.mark.timeout(180)  # (the jobs' own bound: torch imported in w + 1 processes)
@pytest.mark.parametrize(("w", "launcher"), [(2, "local"), (3, "local"), (4, "local"), (4, "mpi")])
def test_a_torch_loop_with_uneven_data_ends_alike_on_every_rank(
    w: int, launcher: str, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    outs = launch(w, tmp_path, "torch", launcher=launcher)
    want = reference(w)
    for r, out in outs.items():
        assert out["join"] == w - 1
        assert out["params"] == pytest.approx(want, rel=1e-5, abs=1e-6)
        if w & (w - 1) == 0:  # Adasum: a joined rank's zeros in its own place (Horovod's)
            assert len(out["adasum"]) == joinprog.batches(r)
            for step, got in enumerate(out["adasum"]):
                rows = [
                    joinprog.value(q, step).astype(np.float64).tolist()
                    if step < joinprog.batches(q)
                    else [0.0] * 5
                    for q in range(w)
                ]
                np.testing.assert_allclose(got, adasum_reference(rows), rtol=1e-12)
                assert got == outs[w - 1]["adasum"][step]  # the same bits on every rank


def test_the_parameter_server_path_refuses_join_naming_the_path(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    for out in launch(2, tmp_path, "ps", servers=1).values():
        assert out["join"].startswith("NotImplementedError: hvd.join() with more than one worker runs on"), (
            out
        )
        assert "not on the parameter-server path (comm='ps')" in out["join"], out
        for what in ("allreduce", "add_process_set"):
            assert out[what].startswith(f"{what}: process sets other than the global one run on the"), out
            assert "not on this worker's path ('ps'): the parameter servers sum each key" in out[what], out
