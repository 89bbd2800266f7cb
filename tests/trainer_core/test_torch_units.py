"""trainer_core.torch in one process: bucketing, tensors lent without copies, the compression
choices, the runtime's choice of path, option validation and one-rank (no launcher) behaviour."""

from __future__ import annotations

import ast
import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="trainer_core.torch needs torch (the torch extra: pip install -e '.[torch]')"
)

from trainer_core.errors import ConfigError  # noqa: E402
from trainer_core.torch import buckets, ops, runtime, tensors  # noqa: E402
from trainer_core.torch import compression as tcomp  # noqa: E402
from trainer_core.torch.backend import Solo, local_of  # noqa: E402
from trainer_core.torch.optimizer import DistributedOptimizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def solo() -> runtime.Runtime:
    rt = runtime.Runtime()
    rt.attach(Solo())
    return rt


# -- bucketing ------------------------------------------------------------------------------------
def test_plan_is_reverse_order_by_dtype_and_limit() -> None:
    sizes = [("float32", 40), ("float32", 40), ("float16", 10), ("float32", 40), ("float32", 200)]
    assert buckets.plan(sizes, 100) == [[4], [3, 1], [2], [0]]
    assert buckets.plan(sizes, 0) == [[4], [3], [2], [1], [0]]
    assert buckets.plan(sizes, 10**9) == [[4, 3, 1, 0], [2]]
    assert buckets.plan([], 10) == []


def test_large_parameters_travel_alone_in_their_own_memory() -> None:
    """bench/torch_step.py's MLP (1024-2048-1024-10): its two 8 MiB weights get a bucket each
    (no copy into a bucket and back), the small parameters between them are fused."""
    mib = 1024 * 1024
    mlp = [
        ("float32", 8 * mib),
        ("float32", 8192),
        ("float32", 8 * mib),
        ("float32", 4096),
        ("float32", 40960),
        ("float32", 40),
    ]
    assert buckets.plan(mlp, 25 * mib) == [[5, 4, 3], [2], [1], [0]]
    assert mib == buckets.ALONE
    sizes = [("float32", 40), ("float32", 500), ("float32", 40), ("float16", 10), ("float32", 40)]
    assert buckets.plan(sizes, 10**9, alone=500) == [[4, 2], [3], [1], [0]]
    assert buckets.plan(sizes, 0, alone=500) == [[4], [3], [2], [1], [0]]


def test_compressed_buckets_are_not_cut_for_size() -> None:
    """trainer_core's compressors copy their input anyway: a large parameter stays fused."""
    m = torch.nn.Sequential(torch.nn.Linear(600, 512), torch.nn.Tanh(), torch.nn.Linear(512, 3))
    plain = DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), runtime=solo())
    onebit = DistributedOptimizer(
        torch.optim.SGD(m.parameters(), lr=0.1), compression=tcomp.Compression.onebit, runtime=solo()
    )
    assert plain._tracker.buckets == [[3, 2, 1], [0]]
    assert onebit._tracker.buckets == [[3, 2, 1, 0]]


class Recording(Solo):
    """One rank that keeps every array lent to its allreduce."""

    def __init__(self) -> None:
        self.lent: list[np.ndarray] = []

    def allreduce_async(
        self,
        array: Any,
        op: str,
        kind: str | None = None,
        out: Any = None,
        name: Any = None,
        fuse: bool = True,
    ) -> Any:
        assert not fuse  # the optimizer's buckets are its fusion: never fused again
        self.lent.append(array)
        return super().allreduce_async(array, op, kind, out)


def test_fused_buckets_reuse_one_buffer_and_large_gradients_go_as_they_are() -> None:
    """Every step, a bucket of several gradients is copied into the same buffer (not a fresh
    concatenation each step), and a gradient of ``ALONE`` bytes or more is lent itself."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(600, 512), torch.nn.Tanh(), torch.nn.Linear(512, 3))
    ref = copy.deepcopy(m)
    rt = runtime.Runtime()
    backend = rt.attach(Recording())
    assert isinstance(backend, Recording)
    opt = DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters(), runtime=rt)
    plain = torch.optim.SGD(ref.parameters(), lr=0.1)
    x = torch.randn(4, 600, generator=torch.Generator().manual_seed(2))
    weights: list[np.ndarray] = []
    for _ in range(3):
        m(x).pow(2).sum().backward()
        weights.append(m[0].weight.grad.numpy())  # the large weight's gradient of this step
        opt.step()
        opt.zero_grad(set_to_none=True)
        step(ref, plain, x)
    assert opt._tracker.buckets == [[3, 2, 1], [0]]
    fused, alone = backend.lent[0::2], backend.lent[1::2]
    assert len(fused) == 3 and all(np.shares_memory(a, fused[0]) for a in fused)
    assert all(np.shares_memory(a, w) for a, w in zip(alone, weights, strict=True))
    for p, q in zip(m.parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, q)


def test_tracker_starts_buckets_in_order_whatever_order_params_are_ready() -> None:
    t = buckets.Tracker([[3, 2], [1], [0]])
    assert t.ready(1) == []  # bucket 1 waits for bucket 0
    assert t.ready(3) == []
    assert t.ready(2) == [0, 1]
    assert t.rest() == [2]  # parameter 0 never became ready (unused): started in step()
    t.reset()
    assert not t.pending()
    assert t.ready(0) == [] and t.pending()
    with pytest.raises(RuntimeError, match="twice"):
        t.ready(0)


# -- tensors ----------------------------------------------------------------------------------------
def test_contiguous_cpu_tensors_are_lent_without_a_copy() -> None:
    t = torch.arange(6, dtype=torch.float32)
    a = tensors.as_array(t)
    a[0] = 42.0
    assert t[0].item() == 42.0
    back = tensors.as_tensor(a, torch.float32, (2, 3))
    assert back.data_ptr() == t.data_ptr() and back.shape == (2, 3)


def test_bfloat16_travels_as_its_bits() -> None:
    t = torch.tensor([1.5, -2.25, 3.0], dtype=torch.bfloat16)
    a = tensors.as_array(t)
    assert a.dtype == np.uint16 and tensors.kind_of(t) == "bfloat16"
    assert torch.equal(tensors.as_tensor(a, torch.bfloat16), t)


def test_sparse_tensors_are_refused_clearly() -> None:
    s = torch.sparse_coo_tensor([[0]], [1.0], (3,), check_invariants=True)
    with pytest.raises(ValueError, match="sparse"):
        tensors.check_dense(s, "the gradient of 'emb.weight'")


# -- compression ------------------------------------------------------------------------------------
def test_fp16_compresses_and_restores_the_dtype() -> None:
    t = torch.tensor([1.0, 2.5], dtype=torch.float32)
    c, ctx = tcomp.Compression.fp16.compress(t)
    assert c.dtype == torch.float16
    assert tcomp.Compression.fp16.decompress(c, ctx).dtype == torch.float32
    i = torch.tensor([1, 2])
    assert tcomp.Compression.fp16.compress(i)[0] is i


def test_trainer_core_compressors_are_checked_when_made() -> None:
    assert tcomp.Compression.onebit.type == "1bit"
    assert tcomp.Compression.powersgd(rank=2).per_parameter
    assert not tcomp.Compression.topk(0.1).per_parameter
    with pytest.raises(ValueError, match="unknown compression type"):
        tcomp.Compression.from_params({"type": "3bit"})
    with pytest.raises(ValueError, match="compression must be"):
        tcomp.check("fp16")


# -- runtime ------------------------------------------------------------------------------------------
def test_the_path_follows_the_job() -> None:
    assert runtime.choose({}, None) == "solo"
    assert runtime.choose({"DMLC_ROLE": "worker", "DMLC_NUM_SERVER": "0"}, None) == "allreduce"
    assert runtime.choose({"DMLC_ROLE": "worker", "DMLC_NUM_SERVER": "2"}, None) == "ps"
    with pytest.raises(ConfigError, match="needs parameter servers"):
        runtime.choose({"DMLC_ROLE": "worker", "DMLC_NUM_SERVER": "0"}, "ps")
    # with servers: the collectives beside the KV store, over one registration (train.joint)
    assert runtime.choose({"DMLC_ROLE": "worker", "DMLC_NUM_SERVER": "1"}, "allreduce") == "allreduce"
    with pytest.raises(ConfigError, match="path must be"):
        runtime.choose({}, "nccl")


def test_not_initialized_says_so() -> None:
    with pytest.raises(ValueError, match=r"call trainer_core.torch.init\(\) first"):
        ops.allreduce(torch.ones(2), runtime=runtime.Runtime())


def test_local_rank_from_hosts() -> None:
    assert local_of(["a", "b", "a", "a"], 2) == (1, 3)
    assert local_of(["a", "b", "a", "a"], 1) == (0, 1)


# -- the optimizer's options --------------------------------------------------------------------------
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"backward_passes_per_step": 0}, "backward_passes_per_step"),
        ({"op": ops.Adasum, "compression": tcomp.Compression.onebit}, "Adasum"),
        ({"op": ops.Product}, "not Product"),
        ({"op": "prod"}, "op must be"),
        ({"comm": "ps"}, "initialized with comm"),
        ({"compression": "1bit"}, "compression must be"),
        ({"fusion_threshold": -1}, "fusion_threshold"),
        ({"op": ops.Max, "compression": tcomp.Compression.onebit}, "sum or average"),
    ],
)
def test_bad_options_are_clear_errors(kwargs: dict, match: str) -> None:
    m = model()
    rt = runtime.Runtime()
    from trainer_core.collective import Group  # a one-rank group: comm="allreduce"
    from trainer_core.collective.fabric import Fabric
    from trainer_core.torch.backend import Collective

    rt.attach(Collective(Group(Fabric(1).endpoint(0))))
    with pytest.raises(ValueError, match=match):
        DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), runtime=rt, **kwargs)
    rt.shutdown()


def test_named_parameters_must_name_every_parameter() -> None:
    m = model()
    named = list(m.named_parameters())[:-1]
    with pytest.raises(ValueError, match="not named"):
        DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named, runtime=solo())
    with pytest.raises(ValueError, match="LBFGS"):
        DistributedOptimizer(torch.optim.LBFGS(m.parameters()), runtime=solo())
    with pytest.raises(ValueError, match="server_optimizer needs comm='ps'"):
        DistributedOptimizer(
            torch.optim.SGD(m.parameters(), lr=0.1), server_optimizer={"type": "sgd"}, runtime=solo()
        )


def step(m: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    m(x).pow(2).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def test_one_rank_trains_as_the_plain_optimizer() -> None:
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    a, b = model(), model()
    plain = torch.optim.SGD(a.parameters(), lr=0.05, momentum=0.9)
    dist = DistributedOptimizer(
        torch.optim.SGD(b.parameters(), lr=0.05, momentum=0.9), b.named_parameters(), runtime=solo()
    )
    assert isinstance(dist, torch.optim.SGD)
    for _ in range(3):
        step(a, plain, x)
        step(b, dist, x)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)


def test_too_many_backward_passes_is_horovods_error() -> None:
    m = model()
    DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), runtime=solo())
    x = torch.randn(2, 4)
    m(x).sum().backward()
    with pytest.raises(AssertionError, match="more than backward_passes_per_step"):
        m(x).sum().backward()


def test_zero_grad_between_backward_and_step_is_refused() -> None:
    m = model()
    opt = DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), runtime=solo())
    m(torch.randn(2, 4)).sum().backward()
    with pytest.raises(AssertionError, match=r"before optimizer\.step"):
        opt.zero_grad()
    opt.step()
    opt.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in m.parameters())


def test_sparse_gradients_are_a_clear_error_or_made_dense() -> None:
    emb = torch.nn.Embedding(10, 3, sparse=True)
    DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1), emb.named_parameters(), runtime=solo())
    with pytest.raises(ValueError, match="'weight' is a sparse tensor"):
        emb(torch.tensor([1, 2])).sum().backward()  # met in the hook, where the exchange would start
    emb2 = torch.nn.Embedding(10, 3, sparse=True)
    opt2 = DistributedOptimizer(
        torch.optim.SGD(emb2.parameters(), lr=0.1), sparse_as_dense=True, runtime=solo()
    )
    before = emb2.weight.detach().clone()
    emb2(torch.tensor([1, 2])).sum().backward()
    opt2.step()
    assert not torch.equal(before[1], emb2.weight[1]) and torch.equal(before[0], emb2.weight[0])


def test_only_trainer_core_torch_imports_torch() -> None:
    bad = []
    for pkg in ("launchkit", "trainer_core", "dmlc_env"):
        for path in (ROOT / pkg).rglob("*.py"):
            if path.is_relative_to(ROOT / "trainer_core" / "torch"):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = [node.module or ""]
                if any(n == "torch" or n.startswith("torch.") for n in names):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bad, f"only trainer_core/torch may import torch: {bad}"


def test_synchronize_then_clip_then_step_without_a_second_synchronize() -> None:
    m = model()
    opt = DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), runtime=solo())
    m(torch.randn(4, 4) * 100).sum().backward()
    opt.synchronize()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1e-3)
    before = [p.detach().clone() for p in m.parameters()]
    with opt.skip_synchronize():
        opt.step()
    moved = (
        sum(float((p.detach() - b).norm() ** 2) for p, b in zip(m.parameters(), before, strict=True)) ** 0.5
    )
    assert 0 < moved <= 1.01e-4  # lr times the clipped norm
    m(torch.randn(4, 4)).sum().backward()
    opt.step()  # the next step synchronizes again
