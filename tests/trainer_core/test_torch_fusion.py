"""Horovod's fusion settings in trainer_core.torch (torch/fusion_settings.py), in one process: the
environment read at ``init()``, the group's fusion it turns on, the optimizer's buckets, and the
ops of several ranks on in-process links fused. Real jobs: test_torch_fusion_jobs.py."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="trainer_core.torch needs torch (the torch extra)")

import trainer_core.torch as hvd  # noqa: E402
from tests.trainer_core.torchranks import on_ranks  # noqa: E402
from trainer_core.errors import ConfigError  # noqa: E402
from trainer_core.torch.backend import Collective, Solo  # noqa: E402
from trainer_core.torch.fusion_settings import DEFAULT_THRESHOLD, Fusion, from_environ  # noqa: E402
from trainer_core.torch.runtime import Runtime  # noqa: E402


def test_horovods_defaults_and_values() -> None:
    assert from_environ({}) == Fusion(DEFAULT_THRESHOLD, 0.001, False)
    assert DEFAULT_THRESHOLD == 128 * 1024 * 1024
    got = from_environ({"HOROVOD_FUSION_THRESHOLD": "0", "HOROVOD_CYCLE_TIME": "3.5"})
    assert got == Fusion(0, 0.0035, True)


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"HOROVOD_FUSION_THRESHOLD": "64MB"}, "HOROVOD_FUSION_THRESHOLD must be a whole number of bytes"),
        ({"HOROVOD_FUSION_THRESHOLD": "-1"}, "0 or more"),
        ({"HOROVOD_CYCLE_TIME": "fast"}, "HOROVOD_CYCLE_TIME must be a number of milliseconds"),
        ({"HOROVOD_CYCLE_TIME": "nan"}, "'nan'"),
    ],
)
def test_a_bad_value_is_a_clear_error(env: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        from_environ(env)


def test_init_reads_them_before_joining() -> None:
    with pytest.raises(ConfigError, match="HOROVOD_CYCLE_TIME"):
        Runtime().init(environ={"HOROVOD_CYCLE_TIME": "-2"})
    b = Runtime().init(environ={"HOROVOD_FUSION_THRESHOLD": "1024"})
    assert isinstance(b, Solo) and b.fusion == Fusion(1024, 0.001, True)


def _model() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))


def test_the_optimizers_buckets_follow_the_threshold_where_it_was_set() -> None:
    def buckets(fusion: Fusion | None, **kw: Any) -> int:
        rt = Runtime()
        backend = rt.attach(Solo())
        if fusion is not None:
            backend.fuse(fusion)
        m = _model()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), runtime=rt, **kw)
        return len(opt._tracker.buckets)

    assert buckets(None) == 1  # 25 MiB
    assert buckets(Fusion(DEFAULT_THRESHOLD, 0.001, False)) == 1  # not set: 25 MiB still
    assert buckets(Fusion(0, 0.001, True)) == 4  # set to 0: a bucket per parameter
    assert buckets(Fusion(0, 0.001, True), fusion_threshold=1 << 20) == 1  # the argument wins


def test_fused_ops_of_several_ranks_equal_the_unfused_ones() -> None:
    def run(threshold: int) -> list[Any]:
        def body(r: int, rt: Runtime) -> tuple[list[list[float]], int]:
            backend = rt.backend()
            assert isinstance(backend, Collective)
            backend.fuse(Fusion(threshold, 30.0, True))
            before = backend.group.collectives
            names = [f"x{i}" for i in range(12)][:: -1 if r == 1 else 1]
            hs = {
                n: hvd.allreduce_async(torch.full((int(n[1:]) + 1,), r + 0.1), name=n, runtime=rt)
                for n in names
            }
            got = [hvd.synchronize(hs[f"x{i}"]).tolist() for i in range(12)]
            grouped = hvd.grouped_allreduce([torch.ones(3) * r, torch.ones(2)], op=hvd.Sum, runtime=rt)
            return got + [g.tolist() for g in grouped], backend.group.collectives - before

        return on_ranks(3, body)

    fused, alone = run(1 << 20), run(0)
    assert [f[0] for f in fused] == [a[0] for a in alone]
    assert [a[1] for a in alone] == [14] * 3
    assert all(f[1] < 14 for f in fused), [f[1] for f in fused]
    assert fused[0][0][-2:] == [[3.0] * 3, [3.0] * 2]
