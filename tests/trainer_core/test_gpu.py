"""trainer_core on a real GPU, in one process: the optimizer rules, the local KV store (plain and
compressed), the collectives (host path and NCCL) and torch's CUDA tensors on cupy arrays, each
compared with the same calls on numpy. Every test skips where there is no usable GPU (``gpu()``:
every CI machine); ``scripts/gpu-check.sh`` runs them on a GPU machine.

Float results on the device may differ from the host's in the last bits where the device fuses a
multiply and an add (the optimizer rules): compared with a tolerance there, bit for bit elsewhere.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from tests.trainer_core.gpu import gpu, same_bits, torch_cuda
from trainer_core import kv as kvmod
from trainer_core.collective import ErrorFeedback, Group
from trainer_core.collective.fabric import Fabric, run_ranks
from trainer_core.collective.nccl import NcclPath, load
from trainer_core.optim import rules
from trainer_core.xp import array_module, is_device_array

pytestmark = pytest.mark.timeout(120)


def host(x: Any) -> np.ndarray:
    return x.get() if is_device_array(x) else np.asarray(x)


# -- the optimizer rules ---------------------------------------------------------------------


def _rule_steps(xp: Any, name: str) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    w0, grads = (
        rng.standard_normal(1000).astype(np.float32),
        rng.standard_normal((4, 1000)).astype(np.float32),
    )
    w, m, v = xp.asarray(w0.copy()), xp.zeros(1000, np.float32), xp.zeros(1000, np.float32)
    for t, g in enumerate(grads, start=1):
        g = xp.asarray(g)
        if name == "sgd":
            rules.sgd(w, g, 0.1, wd=1e-3, rescale_grad=0.5, clip_gradient=1.0)
        elif name == "momentum":
            rules.sgd_momentum(w, g, m, 0.1, 0.9, wd=1e-3, clip_gradient=1.0)
        elif name == "nag":
            rules.nag(w, g, m, 0.1, 0.9, wd=1e-3)
        else:
            rules.adam(w, g, m, v, t, 0.01, 0.9, 0.999, 1e-8, wd=1e-3)
    assert array_module(w) is xp
    return [host(w), host(m), host(v)]


@pytest.mark.parametrize("name", ["sgd", "momentum", "nag", "adam"])
def test_optimizer_rules_on_device_arrays_equal_numpy(name: str) -> None:
    cupy = gpu()
    for got, want in zip(_rule_steps(cupy, name), _rule_steps(np, name), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# -- the local KV store ----------------------------------------------------------------------


@pytest.mark.parametrize("params", [None, {"type": "2bit", "threshold": 0.5}, {"type": "1bit"}])
def test_local_store_with_device_arrays_equals_the_host_store(params: dict | None) -> None:
    """Two devices' gradients pushed, pulled into a device array: the same bits as the store fed
    numpy (compressed: the CUDA kernels against the host kernels, the residuals kept on the device)."""
    cupy = gpu()
    n = 10007
    rng = np.random.default_rng(5)
    steps = [[rng.standard_normal(n).astype(np.float32) for _ in range(2)] for _ in range(3)]

    def run(xp: Any) -> list[np.ndarray]:
        kv = kvmod.create("local")
        kv.init("w", np.zeros(n, np.float32))
        if params is not None:
            kv.set_gradient_compression(params)
        outs = []
        for grads in steps:
            kv.push("w", [xp.asarray(g) for g in grads])
            out = xp.empty(n, np.float32)
            kv.pull("w", out)
            assert array_module(out) is xp
            outs.append(host(out))
        kv.close()
        return outs

    for got, want in zip(run(cupy), run(np), strict=True):
        assert same_bits(got, want)


# -- the collectives -------------------------------------------------------------------------


def test_host_path_collectives_take_device_arrays() -> None:
    """Three ranks (threads) without NCCL: device arrays reduced through host memory, the results
    on the device and equal to numpy's."""
    cupy = gpu()
    w = 3
    fabric = Fabric(w, timeout=20)

    def body(r: int) -> list[Any]:
        with Group(fabric.endpoint(r)) as g:
            a = cupy.arange(100000, dtype=cupy.float32) * (r + 1)
            out = [
                g.allreduce(a),
                g.broadcast(cupy.full(5, r, cupy.int64), root=2),
                g.allgather(cupy.full(r + 1, r)),
            ]
            out.append(g.compressed_allreduce(a, ErrorFeedback({"type": "1bit"})))
            return out

    res = run_ranks(w, body)
    want = np.arange(100000, dtype=np.float32) * 6
    for s, b, ga, onebit in res:
        assert all(is_device_array(x) for x in (s, b, ga, onebit))
        assert same_bits(host(s), want)
        assert host(b).tolist() == [2] * 5 and host(ga).tolist() == [0, 1, 1, 2, 2, 2]
        assert same_bits(host(onebit), host(res[0][3]))  # every rank the same bits


def one_rank_nccl() -> tuple[Any, NcclPath, Group]:
    """cupy, a one-rank NCCL path on the one GPU, and a group that takes it (skips without)."""
    cupy = gpu()
    nccl = load()
    if nccl is None:
        pytest.skip("cupy's NCCL binding does not load here")
    path = NcclPath(nccl, 0, 1, tuple(nccl.get_unique_id()))
    return cupy, path, Group(Fabric(1, timeout=20).endpoint(0), nccl=path)


def test_nccl_runs_a_one_rank_group_on_the_device() -> None:
    """cupy's NCCL binding on the real library (a one-rank communicator: the one GPU): the pointer,
    count and type arithmetic of every operation against NCCL itself."""
    cupy, path, g = one_rank_nccl()
    with g:
        x = cupy.linspace(-1, 1, 1001, dtype=cupy.float32)
        assert same_bits(host(g.allreduce(x)), host(x))
        assert same_bits(host(g.allreduce(x, op="mean")), host(x))
        half = cupy.arange(10, dtype=cupy.float16)
        assert same_bits(host(g.allreduce(half, op="max")), host(half))
        assert host(g.broadcast(cupy.arange(7, dtype=cupy.int64), root=0)).tolist() == list(range(7))
        assert host(g.allgather(cupy.arange(3, dtype=cupy.int32))).tolist() == [0, 1, 2]
        assert host(g.reduce_scatter(cupy.ones((4, 2), cupy.float64))).tolist() == [[1.0, 1.0]] * 4
        grouped = g.grouped_allreduce([cupy.ones(3, cupy.float32), cupy.ones(2, cupy.float64)], op="mean")
        assert [host(a).tolist() for a in grouped] == [[1.0] * 3, [1.0] * 2]
        g.barrier()
    assert path._comm is None  # closed with the group


def test_nccl_results_follow_the_callers_stream() -> None:
    """An input written by a kernel on a non-default stream is reduced after that kernel."""
    cupy, _, g = one_rank_nccl()
    with g:
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            x = cupy.zeros(1 << 22, cupy.float32)
            x += 3.0
            got = g.allreduce(x)
        assert float(host(got).min()) == 3.0 and float(host(got).max()) == 3.0


# -- torch's CUDA tensors ----------------------------------------------------------------------


def test_cuda_tensors_are_lent_to_cupy_without_a_copy() -> None:
    torch = torch_cuda()
    from trainer_core.torch.tensors import as_array, as_tensor

    t = torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4)
    a = as_array(t)
    assert is_device_array(a) and int(a.data.ptr) == t.data_ptr()
    a *= 2  # the tensor's own memory
    assert t.cpu().reshape(-1).tolist() == [2.0 * i for i in range(12)]
    bf = torch.linspace(-1, 1, 9, device="cuda").to(torch.bfloat16)
    bits = as_array(bf)
    assert bits.dtype == np.uint16 and int(bits.data.ptr) == bf.data_ptr()
    back = as_tensor(bits, torch.bfloat16, (9,))
    assert back.device.type == "cuda" and torch.equal(back, bf)
    flags = torch.tensor([True, False, True], device="cuda")
    assert torch.equal(as_tensor(as_array(flags), torch.bool), flags)


def test_a_cuda_tensor_allreduce_through_the_host_path_lands_in_the_tensor() -> None:
    torch = torch_cuda()
    from trainer_core.torch.tensors import as_array

    w = 2
    fabric = Fabric(w, timeout=20)
    got: list[Any] = [None] * w
    lock = threading.Lock()

    def body(r: int) -> None:
        t = torch.full((1000,), float(r + 1), device="cuda")
        with Group(fabric.endpoint(r)) as g:
            g.allreduce(as_array(t), out=as_array(t))
        with lock:
            got[r] = t.cpu()

    run_ranks(w, body)
    assert all(torch.equal(t, torch.full((1000,), 3.0)) for t in got)
