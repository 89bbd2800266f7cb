"""Operations that differ across ranks, among real worker processes of a ``-s 0`` job launched with
``launchkit launch --launcher local`` (program: agreementprog.py): each is an error on every
rank within 2 s saying which ranks passed what, and the next operation is right; threads are
matched by name. Before the negotiation (collective/negotiator.py) each case returned a wrong
result, reinterpreted bytes or stalled, and the jobs exited 0."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.launchkit.procs import parse_prefixed, run

PROG = str(Path(__file__).with_name("agreementprog.py"))


def launch(workers: int, mode: str, tmp_path: Path, *more: str) -> dict[int, dict]:
    res = run(
        ["launch", "-n", str(workers), "-s", "0", "--launcher", "local", sys.executable, PROG, mode, *more],
        cwd=tmp_path,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    outs = parse_prefixed(res.stdout)
    assert sorted(outs) == [("worker", r) for r in range(workers)]
    return {r: outs[("worker", r)] for r in range(workers)}


def _who(values: list[str]) -> str:
    """``rank 0 x, ranks 1, 2 y`` (as agreement._who writes it)."""
    by: dict[str, list[int]] = {}
    for r, v in enumerate(values):
        by.setdefault(v, []).append(r)
    return ", ".join(
        ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs)) + f" {v}" for v, rs in by.items()
    )


def check_cases(outs: dict[int, dict], w: int) -> None:
    """What every rank of a ``cases`` run must have got (also across hosts: tests/cluster)."""
    rs = range(w)
    want = {
        "lengths": f"different shapes: {_who([f'({4 + r},)' for r in rs])}",
        "dtypes": f"different dtypes: {_who([('float32', 'float64', 'int32', 'int64')[r] for r in rs])}",
        "ops": f"different ops: {_who([('sum', 'max', 'min', 'mean')[r] for r in rs])}",
        "roots": f"different roots: {_who([str(r) for r in rs])}",
        "kinds": f"different operations: {_who(['allreduce' if r == 0 else 'broadcast' for r in rs])}",
        "refused": "refused by rank 1 (rank 1: ValueError: collective op must be one of",
        "list": "refused by rank 1 (rank 1: TypeError: collective allreduce takes a numpy or cupy array, not list",
    }
    total = float(sum(r + 1 for r in rs))
    assert sorted(outs) == list(rs)
    for r, out in outs.items():
        for case, text in want.items():
            got = out[case]
            assert got["next"] == [total, total], (r, case, got)
            assert got["seconds"] < 2.0, (r, case, got)
            if r == 1 and case == "refused":  # its own check: the error the caller made, at once
                assert got["error"].startswith("ValueError: collective op must be one of"), got
            elif r == 1 and case == "list":
                assert got["error"].startswith(
                    "TypeError: collective allreduce takes a numpy or cupy array"
                ), got
            else:
                assert got["error"].startswith("CollectiveMismatch: collective "), (r, case, got)
                assert text in got["error"], (r, case, got)
        assert out["agreed"]["result"] == [float(w)] * 4


def check_threads(outs: dict[int, dict], w: int) -> None:
    """What every rank of a ``threads`` run must have got."""
    want = {f"{t}.{i}": w * (i + 1) * (1.0 if t == "a" else 100.0) for t in "ab" for i in range(10)}
    assert sorted(outs) == list(range(w))
    for out in outs.values():
        assert {k: v for k, v in out.items() if k not in ("rank", "size", "host")} == want


@pytest.mark.parametrize("w", [2, 3, 4])
def test_every_mismatch_fails_on_every_rank_within_2_s_and_the_next_operation_is_right(
    w: int, tmp_path: Path
) -> None:
    check_cases(launch(w, "cases", tmp_path), w)


@pytest.mark.parametrize(("w", "force"), [(2, "ring"), (3, "recursive_doubling"), (4, "ring")])
def test_every_mismatch_fails_on_every_rank_with_an_algorithm_forced_off_the_segment(
    w: int, force: str, tmp_path: Path
) -> None:
    """A forced algorithm's allreduce moves its data while the ranks' records are compared
    (collective/speculation.py): a difference found then is the same error on every rank, and
    the next operation (in the same slot's tags' reach) is right."""
    check_cases(launch(w, "cases", tmp_path, force), w)


@pytest.mark.parametrize(("w", "force"), [(2, "ring"), (3, "ring")])
def test_two_threads_per_rank_with_a_forced_algorithm_are_matched_by_name(
    w: int, force: str, tmp_path: Path
) -> None:
    check_threads(launch(w, "threads", tmp_path, force), w)


@pytest.mark.parametrize("w", [2, 3])
def test_two_threads_per_rank_in_opposite_orders_are_matched_by_name(w: int, tmp_path: Path) -> None:
    check_threads(launch(w, "threads", tmp_path), w)


def check_shut_down(outs: dict[int, dict], w: int) -> None:
    """What every rank of a ``shutdown`` run must have got: rank 1 shut down, the others' next
    allreduce fails at once naming it."""
    for r, out in outs.items():
        assert out["before"] == sum(range(1, w + 1)), out
        if r == 1:
            continue
        assert out["error"].startswith("PeerShutDown: collective: rank 1 (worker 1 on "), out
        assert "shut down (closed its group) after its 2 operations" in out["error"], out
        assert "allreduce 'grad.3'" in out["error"], out
        assert out["seconds"] < 2.0, out


def test_a_rank_that_shuts_down_fails_the_others_next_operation_naming_it(tmp_path: Path) -> None:
    check_shut_down(launch(3, "shutdown", tmp_path), 3)


@pytest.mark.parametrize("w", [2, 3, 4])
def test_a_name_submitted_twice_while_in_flight_fails_on_every_rank(w: int, tmp_path: Path) -> None:
    """Rank 0 submits 'x' twice while its 'a' waits for the others: every 'x' fails, on every
    rank, saying so; 'a' and the next operation are right."""
    outs = launch(w, "twice", tmp_path)
    for r, out in outs.items():
        assert out["a"] == [float(w)] * 3 and out["next"] == [float(sum(range(1, w + 1)))] * 2, (r, out)
        for key in ("x1", "x2") if r == 0 else ("x",):
            assert out[key].startswith("CollectiveMismatch: collective "), (r, out)
            assert "'x' submitted twice while in flight" in out[key], (r, out)


@pytest.mark.parametrize("w", [2, 3])
def test_models_that_differ_across_ranks_fail_on_every_rank_at_the_first_step(w: int, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    outs = launch(w, "torch", tmp_path)
    first = "parameter 0: rank 0 has 'weight' (2, 4) torch.float32, rank 1 'weight' (3, 4) torch.float32"
    for out in outs.values():
        assert (
            out["optimizer"]
            == f"ModelMismatch: DistributedOptimizer: the model differs across ranks: {first}"
        )
        bias = "parameter 0: rank 0 has 'bias' (2,) torch.float32, rank 1 'bias' (3,) torch.float32"
        assert out["broadcast_parameters"] == (  # a state_dict goes by name: bias first
            f"ModelMismatch: broadcast_parameters: the model differs across ranks: {bias}"
        )
        assert out["alike"] == "ok"
