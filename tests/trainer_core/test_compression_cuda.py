"""The CUDA kernels of compression/_cuda.py: byte-identical to the host kernels.

Two ways, so that they are checked on every machine:

* ``host_sim``: the kernels' CUDA C body compiled with the host's C++ compiler behind a shim of
  the few CUDA-only lines (thread indices, float16 conversions, atomics, ``__syncthreads`` as a
  no-op with one thread per block), loaded with ctypes and driven by the very glue that drives
  them on cupy (``_cuda.Kernels``), on numpy arrays; compared with the numba and numpy kernels.
  A numpy subclass standing in for cupy's array type carries them through the compressors, the
  dispatch (``kernels.cuda``), the codec, a worker's push and its pulls into device outputs, as a
  cupy array would go, and records every copy between host and "device".
* ``gpu``: the same comparisons on cupy arrays, where cupy and a GPU are there (skipped with the
  reason otherwise), plus the NVRTC compile of the real source wherever cupy imports.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import shutil
import subprocess
import threading
import types
from typing import Any

import numpy as np
import pytest

from tests.trainer_core.gpu import gpu, same_bits
from trainer_core import xp as xpmod
from trainer_core.compression import _cuda, get_compressor, kernels, onebit, twobit
from trainer_core.compression.codec import WorkerCodec
from trainer_core.kv import dist as kv_dist
from trainer_core.kv import local as kv_local

DTYPES = [np.float32, np.float64, np.float16]
SIZES = [0, 1, 7, 8, 15, 16, 17, 1000, 3 * 64 + 5, 10007]

SHIM = r"""
#include <cstring>
struct Dim3 { unsigned int x, y, z; };
static Dim3 threadIdx, blockIdx, blockDim, gridDim;
#define __global__
#define __shared__ static
#define DEV static inline
static inline void __syncthreads() {}
static inline unsigned int atomicAdd(unsigned int* p, unsigned int v) { unsigned int o = *p; *p += v; return o; }
static inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    unsigned long long o = *p; *p += v; return o;
}
DEV float h2f(unsigned short h) { _Float16 x; std::memcpy(&x, &h, 2); return (float)x; }
DEV unsigned short f2h(float f) { _Float16 x = (_Float16)f; unsigned short h; std::memcpy(&h, &x, 2); return h; }
DEV unsigned int bits_of(float x) { unsigned int u; std::memcpy(&u, &x, 4); return u; }
DEV unsigned long long bits_of(double x) { unsigned long long u; std::memcpy(&u, &x, 8); return u; }
DEV float add(float a, float b) { return a + b; }
DEV float sub(float a, float b) { return a - b; }
DEV bool ge(float a, float b) { return a >= b; }
DEV bool le(float a, float b) { return a <= b; }
DEV double widen(float x) { return (double)x; }
DEV float narrow(double x) { return (float)x; }
DEV float qnan() { unsigned int u = 0x7fc00000u; float f; std::memcpy(&f, &u, 4); return f; }
extern "C" void sim_block(unsigned int block, unsigned int grid) {
    blockIdx.x = block; gridDim.x = grid; blockDim.x = 1; threadIdx.x = 0;
}
"""

#: numpy scalar type -> ctypes type of a kernel argument
CTYPES = {
    np.float32: ctypes.c_float,
    np.float64: ctypes.c_double,
    np.int64: ctypes.c_longlong,
    np.int32: ctypes.c_int,
}


class Sim:
    """A kernel of the host-compiled library, called as cupy calls a RawKernel: ``f(grid, block, args)``
    runs every block of the grid (at most ``blocks``; the kernels stride over the rest) with one thread.
    The block index lives in the library's globals and ctypes lets other threads run meanwhile, so
    one launch at a time (the workers of an in-process job are threads)."""

    launching = threading.Lock()

    def __init__(self, lib: ctypes.CDLL, name: str, blocks: int = 3) -> None:
        self.fn, self.lib, self.blocks = getattr(lib, name), lib, blocks
        self.launches = 0

    def __call__(self, grid: tuple[int], block: tuple[int], args: tuple[Any, ...]) -> None:
        assert grid[0] >= 1 and block[0] >= 1
        cargs = [
            ctypes.c_void_p(a.ctypes.data) if isinstance(a, np.ndarray) else CTYPES[type(a)](a) for a in args
        ]
        nb = min(grid[0], self.blocks)
        with Sim.launching:
            for b in range(nb):
                self.lib.sim_block(b, nb)
                self.fn(*cargs)
            self.launches += 1


@pytest.fixture(scope="module")
def host_sim(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Per dtype name, a compile function that returns ``_cuda.Kernels`` over the host-compiled body."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler to build the CUDA kernels' body on the host")
    out: dict[str, Any] = {}
    for dt in DTYPES:
        name = np.dtype(dt).name
        src = tmp_path_factory.mktemp("sim") / f"{name}.cpp"
        src.write_text(SHIM + _cuda.render(dt))
        lib = src.with_suffix(".so")
        cmd = [cxx, "-O2", "-shared", "-fPIC", "-ffp-contract=off", "-o", str(lib), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0 and "_Float16" in proc.stderr:
            pytest.skip("the host C++ compiler has no _Float16")
        assert proc.returncode == 0, proc.stderr
        out[name] = ctypes.CDLL(str(lib))
    return out


def sim_kernels(libs: dict[str, Any], dtype: Any, xp: Any = np) -> _cuda.Kernels:
    lib = libs[np.dtype(dtype).name]
    return _cuda.Kernels(xp, {n: Sim(lib, n) for n in _cuda.NAMES}, dtype, np.asarray)


def gradients(n: int, dtype: Any, steps: int = 3, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed + n)
    return [(rng.standard_normal(n) * 0.7).astype(dtype) for _ in range(steps)]


def subnormal(n: int, dtype: Any, seed: int = 0) -> np.ndarray:
    """Subnormals of both signs, ±0.0 and a few ordinary values: where flushing to zero would show."""
    rng = np.random.default_rng(seed + n)
    tiny = np.finfo(dtype).smallest_subnormal
    x = (rng.integers(-5, 6, n) * tiny).astype(dtype)
    x[rng.random(n) < 0.1] = -0.0
    x[rng.random(n) < 0.05] = 0.75
    return x


# -- pure host-side parts ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_source_of_each_dtype_fills_every_placeholder_and_defines_every_kernel(dtype):
    body = _cuda.render(dtype)
    assert "$" not in body
    g, w, k = _cuda.TYPES[np.dtype(dtype).name]
    assert f"typedef {g} G;" in body and f"typedef {w} W;" in body and f"typedef {k} K;" in body
    for name in _cuda.NAMES:
        assert body.count(f'extern "C" __global__ void {name}(') == 1
    assert _cuda.source(dtype).startswith(_cuda.PREAMBLE)


def test_launch_geometry_covers_the_work_in_at_most_max_blocks():
    assert _cuda.geometry(0) == ((1,), (256,))
    assert _cuda.geometry(256) == ((1,), (256,))
    assert _cuda.geometry(257) == ((2,), (256,))
    assert _cuda.geometry(10**9) == ((_cuda.MAX_BLOCKS,), (256,))
    assert _cuda.geometry(100, threads=64) == ((2,), (64,))


@pytest.mark.parametrize("n", [*SIZES, 2**20 + 3])
def test_payload_sizes_are_those_of_the_host_layouts(n):
    for b in (8, 64, 2048):
        nblocks, nbytes = _cuda.onebit_sizes(n, b)
        assert 8 * nblocks + nbytes == onebit.wire_bytes(n, b)
    assert _cuda.twobit_bytes(n) == twobit.wire_bytes(n)


# -- the kernels, compiled on the host ---------------------------------------------------------


def host_compressor(params: dict[str, Any], dtype: Any) -> Any:
    # the numba kernels where they run (float32/float64), else the numpy ones (tested equal elsewhere)
    return get_compressor(params)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_2bit_kernels_match_the_host_kernels(host_sim, dtype, n):
    k = sim_kernels(host_sim, dtype)
    c = host_compressor({"type": "2bit", "threshold": 0.5}, dtype)
    r = np.zeros(n, np.float64 if dtype == np.float64 else np.float32)
    for g in [*gradients(n, dtype), subnormal(n, dtype)]:
        want, meta = c.encode(g)
        got = k.twobit_encode(g, r, meta["threshold"])
        assert same_bits(got, want) and same_bits(r, c.residual)
        assert same_bits(k.twobit_decode(got, meta["threshold"], n, None), c.decode(want, meta, n, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("block", [8, 64, 2048])
def test_1bit_kernels_match_the_host_kernels(host_sim, dtype, n, block):
    k = sim_kernels(host_sim, dtype)
    c = host_compressor({"type": "1bit", "block_size": block}, dtype)
    r = np.zeros(n, np.float64 if dtype == np.float64 else np.float32)
    for g in [subnormal(n, dtype), *gradients(n, dtype)]:
        want, meta = c.encode(g)
        got = k.onebit_encode(g, r, block)
        assert same_bits(got, want) and same_bits(r, c.residual)
        out = np.full(n, 7, dtype)
        assert k.onebit_decode(got, block, n, out) is out
        assert same_bits(out, c.decode(want, meta, n, dtype))


def poisoned(n: int, dtype: Any, seed: int = 0) -> np.ndarray:
    """Ordinary values with NaN, +inf and -inf among them (at most one of each per 8 values)."""
    g = gradients(n, dtype, steps=1, seed=seed)[0]
    rng = np.random.default_rng(seed + 7 * n)
    for x in (np.nan, np.inf, -np.inf):
        g[rng.random(n) < 0.04] = x
    return g


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 17, 1000, 10007])
@pytest.mark.parametrize(
    "params",
    [{"type": "2bit", "threshold": 0.5}, {"type": "1bit", "block_size": 64}, {"type": "topk", "ratio": 0.01}],
    ids=lambda p: p["type"],
)
def test_kernels_send_non_finite_values_as_the_host_kernels_do(host_sim, dtype, n, params):
    """NaN and +-inf: 2-bit code 01 (NaN), 1-bit blocks of NaN, top-k the values themselves; the
    residual 0 where they were; the same bytes and residual as the host kernels, and the next
    finite step finite again."""
    k = sim_kernels(host_sim, dtype)
    c = host_compressor(params, dtype)
    r = np.zeros(n, np.float64 if dtype == np.float64 else np.float32)
    kind = params["type"]
    for g in [gradients(n, dtype)[0], poisoned(n, dtype), poisoned(n, dtype, seed=3), gradients(n, dtype)[1]]:
        want, meta = c.encode(g)
        if kind == "2bit":
            got = k.twobit_encode(g, r, meta["threshold"])
            dec = k.twobit_decode(got, meta["threshold"], n, None)
        elif kind == "1bit":
            got = k.onebit_encode(g, r, 64)
            dec = k.onebit_decode(got, 64, n, None)
        else:
            got = k.topk_encode(g, r, meta["k"])
            dec = k.topk_decode(got, meta["k"], n, None)
        assert same_bits(got, want) and same_bits(r, c.residual)
        assert same_bits(dec, c.decode(want, meta, n, dtype))
        assert np.isfinite(r).all()
        assert np.isfinite(dec).all() == np.isfinite(g).all()


def at_offset(values: np.ndarray, offset: int) -> np.ndarray:
    """``values`` copied into a buffer at ``offset`` elements from its (aligned) start: a view
    whose address is not a multiple of 4 elements unless ``offset`` is."""
    buf = np.zeros(values.size + 8, values.dtype)
    view = buf[offset : offset + values.size]
    view[...] = values
    return view


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [0, 1, 2, 3, 4])
def test_kernels_read_four_at_a_time_only_where_aligned_with_the_same_bytes(host_sim, dtype, offset):
    """The 2-bit encoder and the 1-bit packer load and store runs of 4 values where the arrays are
    aligned for it, one at a time elsewhere (views at an offset, the tail): the same bytes."""
    k = sim_kernels(host_sim, dtype)
    n = 1000 + 3
    work = np.float64 if dtype == np.float64 else np.float32
    for params in ({"type": "2bit", "threshold": 0.5}, {"type": "1bit", "block_size": 64}):
        c = host_compressor(params, dtype)
        r = at_offset(np.zeros(n, work), offset)
        for g in gradients(n, dtype):
            g = at_offset(g, offset)
            want, meta = c.encode(g)
            if params["type"] == "2bit":
                got = k.twobit_encode(g, r, meta["threshold"])
            else:
                got = k.onebit_encode(g, r, 64)
            assert same_bits(got, want) and same_bits(r, c.residual)


#: blocks whose float32 means depend on the order of the float64 sums: a float32 tie (2**24 + 1)
#: pushed off it only when the two 2**-29 are added together first. Block 8: lanes are single
#: elements, joined (l0 + l1) + (l2 + l3); block 16: lane 0 sums 2**24, 1, 2**-29, 2**-29 in order.
ORDER = {
    8: [2.0**24, 1.0, 2.0**-29, 2.0**-29, -1.0, -1.0, -1.0, -1.0],
    16: [2.0**24, 0, 0, 0, 1.0, 0, 0, 0, 2.0**-29, 0, 0, 0, 2.0**-29, 0, 0, 0],
}


@pytest.mark.parametrize("block", sorted(ORDER))
def test_1bit_means_follow_the_host_summation_order(host_sim, block):
    k = sim_kernels(host_sim, np.float32)
    g = np.array(ORDER[block] * 3, np.float32)
    want, _ = get_compressor({"type": "1bit", "block_size": block}).encode(g)
    pos = [float(v) for v in ORDER[block] if v >= 0]
    # the order does decide the mean here: left to right and exactly give different float32 means
    # (a loop: Python 3.12's sum() of floats is compensated, as exact as fsum here)
    left_to_right = 0.0
    for v in pos:
        left_to_right += v
    assert np.float32(left_to_right / len(pos)) != np.float32(math.fsum(pos) / len(pos))
    assert same_bits(k.onebit_encode(g, np.zeros(g.size, np.float32), block), want)


def tied(n: int, dtype: Any, seed: int) -> np.ndarray:
    """Few distinct magnitudes (ties everywhere, ±0.0 among them)."""
    rng = np.random.default_rng(seed)
    return (rng.integers(-3, 4, n) * 0.25 * rng.choice([-1.0, 1.0], n)).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("ratio", [0.01, 0.3, 1.0])
@pytest.mark.parametrize("data", ["random", "tied", "subnormal"])
def test_topk_kernels_match_the_host_kernels_ties_included(host_sim, dtype, n, ratio, data):
    k = sim_kernels(host_sim, dtype)
    c = host_compressor({"type": "topk", "ratio": ratio}, dtype)
    r = np.zeros(n, np.float64 if dtype == np.float64 else np.float32)
    grads = {
        "random": gradients(n, dtype),
        "tied": [tied(n, dtype, s) for s in range(3)],
        "subnormal": [subnormal(n, dtype, s) for s in range(3)],
    }[data]
    for g in grads:
        want, meta = c.encode(g)
        got = k.topk_encode(g, r, meta["k"])
        assert same_bits(got, want) and same_bits(r, c.residual)
        assert same_bits(k.topk_decode(got, meta["k"], n, None), c.decode(want, meta, n, dtype))


def test_topk_decode_refuses_an_index_beyond_the_values(host_sim):
    k = sim_kernels(host_sim, np.float32)
    bad = np.concatenate([np.array([0, 9], "<u4").view(np.uint8), np.ones(2, "<f4").view(np.uint8)])
    with pytest.raises(ValueError, match="index beyond 5"):
        k.topk_decode(bad, 2, 5, None)


# -- a stand-in for cupy: the dispatch, the codec's transfer and a dist worker's push ----------


ONE_DEVICE = contextlib.nullcontext()


class FakeDevice(np.ndarray):
    """Host memory playing a device array: what reaches it goes through cupy's calls. Where the
    ``device`` fixture sets ``moved``, every copy of host values into a device array is recorded
    there (``("to device", bytes)``), and so is every copy of a device array into another one
    (``("device copy", bytes)``: a temporary on the device)."""

    moved: list[tuple[str, int]] | None = None

    @property
    def device(self) -> Any:  # cupy's Device: a context manager, equal for arrays on one device
        return ONE_DEVICE

    @property
    def data(self) -> Any:  # cupy's MemoryPointer: its address
        return types.SimpleNamespace(ptr=self.ctypes.data)

    def get(self, out: np.ndarray | None = None) -> np.ndarray:
        host = np.empty(self.shape, self.dtype) if out is None else out
        np.copyto(host, self.view(np.ndarray))
        return host

    def set(self, arr: np.ndarray) -> None:  # cupy's copy of a host array into this one
        assert type(arr) is np.ndarray and arr.shape == self.shape and arr.dtype == self.dtype
        assert self.flags.c_contiguous, "cupy sets only C-contiguous arrays"
        record("to device", arr.nbytes)
        np.copyto(self.view(np.ndarray), arr)

    def __setitem__(self, index: Any, value: Any) -> None:
        if isinstance(value, FakeDevice):
            record("device copy", value.nbytes)
        elif isinstance(value, np.ndarray):  # cupy copies a host value up first
            record("to device", value.nbytes)
        super().__setitem__(index, value)


def record(direction: str, nbytes: int) -> None:
    if FakeDevice.moved is not None:
        FakeDevice.moved.append((direction, int(nbytes)))


def fake_asarray(x: Any, dtype: Any = None) -> FakeDevice:
    if not isinstance(x, FakeDevice):  # host values: copied to the "device"
        record("to device", np.asarray(x).nbytes)
    return np.array(x, dtype=dtype).view(FakeDevice)


def fake_cupy() -> types.ModuleType:
    """A module that is numpy, except that arrays it makes are ``FakeDevice``."""

    def wrap(fn: Any) -> Any:
        def call(*a: Any, **kw: Any) -> Any:
            res = fn(*a, **kw)
            return res.view(FakeDevice) if isinstance(res, np.ndarray) else res

        return call

    class Fake(types.ModuleType):
        ndarray = FakeDevice

        def __getattr__(self, name: str) -> Any:
            fn = getattr(np, name)
            return wrap(fn) if callable(fn) and not isinstance(fn, type) else fn

    mod = Fake("fakecupy")
    mod.asarray = fake_asarray  # type: ignore[attr-defined]
    mod.asnumpy = lambda x: np.array(x.view(np.ndarray))  # type: ignore[attr-defined]
    return mod


@pytest.fixture
def device(monkeypatch, host_sim):
    """``FakeDevice`` arrays count as cupy arrays; the CUDA kernels are the host-compiled ones.
    Yields the record of transfers: (direction, bytes) (``FakeDevice.moved``; to the host: the
    page-locked buffers ``payload_to_host`` takes)."""
    fake = fake_cupy()
    monkeypatch.setattr(xpmod, "_cupy", fake)
    built: list[str] = []

    def compile_sim(dtype: Any) -> _cuda.Kernels:
        built.append(np.dtype(dtype).name)
        return sim_kernels(host_sim, dtype, fake)

    monkeypatch.setattr(_cuda, "compile_cupy", compile_sim)
    monkeypatch.setattr(kernels, "_cuda_built", {})
    monkeypatch.setattr(kernels, "_cuda_warned", False)
    moved: list[tuple[str, int]] = []
    monkeypatch.setattr(FakeDevice, "moved", moved)
    real_pinned = xpmod.pinned_empty
    monkeypatch.setattr(xpmod, "pinned_empty", lambda n: (moved.append(("to host", n)), real_pinned(n))[1])

    real_to_host = xpmod.to_host

    def no_full_copy(x: Any) -> np.ndarray:
        if isinstance(x, FakeDevice):
            raise AssertionError(f"to_host of a {type(x).__name__} of {x.nbytes} bytes")
        return real_to_host(x)

    for mod in (xpmod, kv_local, kv_dist):  # every module that took to_host in by name
        monkeypatch.setattr(mod, "to_host", no_full_copy)
    return types.SimpleNamespace(fake=fake, built=built, moved=moved)


def on_device(x: np.ndarray) -> FakeDevice:
    return np.array(x).view(FakeDevice)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "params",
    [{"type": "2bit", "threshold": 0.5}, {"type": "1bit", "block_size": 64}, {"type": "topk", "ratio": 0.05}],
)
def test_a_device_array_takes_the_cuda_kernels_through_the_compressor(device, dtype, params):
    host, dev = get_compressor(params), get_compressor(params)
    n = 3000
    for g in gradients(n, dtype):
        want, meta = host.encode(g)
        got, dmeta = dev.encode(on_device(g))
        assert isinstance(got, FakeDevice) and isinstance(dev.residual, FakeDevice)
        assert dmeta == meta and same_bits(got.view(np.ndarray), want)
        assert same_bits(dev.residual.view(np.ndarray), host.residual)
        out = on_device(np.zeros(n, dtype))
        dev.decode(got, dmeta, n, dtype, out=out)  # device payload, device output
        assert same_bits(out.view(np.ndarray), host.decode(want, meta, n, dtype))
        out2 = on_device(np.zeros(n, dtype))
        dev.decode(want, meta, n, dtype, out=out2)  # host payload, device output: sent up, unpacked there
        assert same_bits(out2.view(np.ndarray), out.view(np.ndarray))
    assert device.built == [np.dtype(dtype).name]  # compiled once
    assert ("to device", len(want)) in device.moved and all(m[1] <= len(want) for m in device.moved)


@pytest.mark.parametrize(
    "params", [{"type": "2bit", "threshold": 0.5}, {"type": "1bit"}, {"type": "topk", "ratio": 0.05}]
)
def test_a_residual_loaded_from_a_checkpoint_follows_a_device_gradient(device, params):
    host, dev = get_compressor(params), get_compressor(params)
    g1, g2 = gradients(500, np.float32)[:2]
    host.encode(g1)
    dev.load_state_dict(host.state_dict())  # as checkpoint.load gives it: host arrays
    want, meta = host.encode(g2)
    got, dmeta = dev.encode(on_device(g2))
    assert isinstance(dev.residual, FakeDevice) and dmeta == meta and same_bits(got.view(np.ndarray), want)
    assert same_bits(dev.residual.view(np.ndarray), host.residual)


def test_kernel_numpy_and_host_arrays_keep_their_kernels(device, monkeypatch, caplog):
    monkeypatch.setattr(kernels.logger(), "propagate", True)
    caplog.set_level(logging.DEBUG, logger=kernels.LOGGER_NAME)
    g = np.linspace(-1, 1, 100, dtype=np.float32)
    assert kernels.cuda("auto", g, g.dtype) is None
    assert kernels.cuda("numpy", on_device(g), g.dtype) is None
    assert isinstance(kernels.cuda("auto", on_device(g), g.dtype), _cuda.Kernels)
    assert kernels.cuda("numba", on_device(g), g.dtype) is kernels.cuda("auto", on_device(g), g.dtype)
    version = getattr(xpmod.cupy_module(), "__version__", "?")  # the stand-in's, not an installed cupy's
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == [
        f"trainer_core compression: CUDA kernels for cupy arrays (cupy {version}; float32 ready)"
    ]  # said once per process
    c = get_compressor({"type": "2bit", "kernel": "numpy"})
    payload, _ = c.encode(on_device(g))  # the array-module kernel, on the "device"
    assert isinstance(payload, FakeDevice) and device.built == ["float32"]


def test_a_compile_failure_falls_back_to_the_array_module_kernels_with_one_warning(
    device, monkeypatch, caplog
):
    def broken(dtype: Any) -> Any:
        raise RuntimeError("nvrtc: error: identifier 'x' is undefined\nmore lines")

    monkeypatch.setattr(_cuda, "compile_cupy", broken)
    log = kernels.logger()
    monkeypatch.setattr(log, "propagate", True)
    params = {"type": "1bit", "block_size": 64}
    host, dev = get_compressor(params), get_compressor(params)
    with caplog.at_level(logging.INFO, logger=kernels.LOGGER_NAME):
        for dtype in (np.float32, np.float32, np.float64):
            g = gradients(500, dtype)[0]
            want, _ = (host if dtype == np.float32 else get_compressor(params)).encode(g)
            got, _ = (dev if dtype == np.float32 else get_compressor(params)).encode(on_device(g))
            assert same_bits(got.view(np.ndarray), want)  # the array-module kernels on the device
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    msg = warnings[0].getMessage()
    assert "CUDA kernels cannot be compiled" in msg and "identifier 'x' is undefined" in msg
    assert "more lines" not in msg and "array-module" in msg


def test_the_codec_copies_a_device_payload_to_the_host_once_at_its_own_size(device):
    codec = WorkerCodec()
    codec.set_params({"type": "2bit", "threshold": 0.5})
    g = on_device(gradients(4096, np.float32)[0])
    payload, _ = codec.encode("w", 0, g)
    assert type(payload) is np.ndarray and payload.dtype == np.uint8 and payload.nbytes == 1024
    assert device.moved == [("to host", 1024)]


def test_flat_sum_keeps_device_values_on_the_device_only_when_asked(device):
    a, b = on_device(np.ones(10, np.float32)), on_device(np.full(10, 2.0, np.float32))
    s = xpmod.flat_sum([a, b], np.dtype(np.float64), device=True)
    assert isinstance(s, FakeDevice) and s.dtype == np.float64 and s.tolist() == [3.0] * 10
    with pytest.raises(AssertionError, match="to_host of a FakeDevice"):
        xpmod.flat_sum([a, b], np.dtype(np.float32), device=False)
    h = xpmod.flat_sum([np.ones((2, 2), np.float32)], None, device=True)
    assert type(h) is np.ndarray and h.shape == (4,)


def test_a_compressed_local_push_of_device_arrays_copies_only_the_payload(device):
    import trainer_core.kv

    n, params = 20000, {"type": "2bit", "threshold": 0.5}
    g1, g2 = gradients(n, np.float32, steps=2)
    kv = trainer_core.kv.create("local")
    kv.init("w", np.zeros(n, np.float32))
    kv.set_gradient_compression(params)
    kv.push("w", [on_device(g1), on_device(g2)])  # two devices' values, summed on the device
    out = np.empty(n, np.float32)
    kv.pull("w", out)
    comp = get_compressor(params)
    want = comp.decode(*comp.encode(g1 + g2), n, np.float32)
    np.testing.assert_array_equal(out, want)
    assert device.moved == [("to host", n // 4)]  # the 2-bit payload, once; never the gradient


def test_a_compressed_push_of_a_device_array_never_copies_the_whole_array_to_the_host(device):
    from tests.trainer_core.test_ps_client import InProcessJob, run_workers

    n, params = 20000, {"type": "2bit", "threshold": 0.5}
    grads = [gradients(n, np.float32, steps=1, seed=s)[0] for s in range(2)]

    def body(kv: Any) -> Any:
        kv.init("w", np.zeros(n, np.float32))
        kv.set_gradient_compression(params)
        kv.push("w", on_device(grads[kv.rank]))
        out = np.empty(n, np.float32)
        kv.pull("w", out)
        return out

    j = InProcessJob(2, 2)
    try:
        results = run_workers(j, "dist_sync", body)
    finally:
        j.stop()

    def round_trip(g: np.ndarray) -> np.ndarray:  # 2bit is elementwise: the parts do not matter
        return get_compressor(params).decode(*get_compressor(params).encode(g), n, np.float32)

    want = round_trip(sum(round_trip(g) for g in grads))  # the pull is compressed by the server too
    for got in results:
        np.testing.assert_array_equal(got, want)
    sizes = [m[1] for m in device.moved]
    assert sizes and max(sizes) <= twobit.wire_bytes(n)  # only compressed parts left the "device"


# -- pulls into device arrays: only the payload goes up, decoded into the output ---------------

PULL_PARAMS = [
    {"type": "2bit", "threshold": 0.5},
    {"type": "1bit", "block_size": 64},
    {"type": "topk", "ratio": 0.05},
]


def run_dist(body: Any, shm: bool = False) -> Any:
    """``body(kv)`` on the one worker of an in-process job with two servers (``cfg``'s bound of
    1000 elements: a bigger key is split in two parts)."""
    from tests.trainer_core.test_ps_client import InProcessJob, run_workers

    j = InProcessJob(1, 2, shm=shm)
    try:
        return run_workers(j, "dist_sync", body)[0]
    finally:
        j.stop()


def local_store() -> Any:
    import trainer_core.kv

    return trainer_core.kv.create("local")


def pulled(kv: Any, key: str, n: int, moved: list[tuple[str, int]], push: Any = None) -> tuple[Any, list]:
    """A pull (a pushpull of ``push``) of ``key`` into a fresh device array, and what it moved."""
    out = on_device(np.full(n, np.nan, np.float32))
    moved.clear()
    if push is None:
        kv.pull(key, out)
    else:
        kv.pushpull(key, on_device(push), out)
    return out.view(np.ndarray).copy(), list(moved)


def payloads(params: dict[str, Any], sizes: list[int]) -> list[tuple[str, int]]:
    return sorted(("to device", get_compressor(params).wire_bytes(s)) for s in sizes)


@pytest.mark.parametrize("params", PULL_PARAMS)
def test_a_compressed_dist_pull_into_a_device_array_moves_up_only_each_parts_payload(device, params):
    n = 20000
    grads = gradients(n, np.float32, steps=2)

    def body(kv: Any) -> Any:
        kv.init(["h", "d"], [np.zeros(n, np.float32)] * 2)
        kv.set_gradient_compression(params)
        seen = []
        for g in grads:  # the same steps on two keys: pulled to the host and to the "device"
            kv.push(["h", "d"], [g, g])
            host = np.empty(n, np.float32)
            kv.pull("h", host)
            seen.append((host, *pulled(kv, "d", n, device.moved)))
        return seen, [p.size for p in kv.meta["d"].parts]

    seen, sizes = run_dist(body)
    assert len(sizes) == 2  # split over the two servers: each part decoded into its slice
    for host, dev, moved in seen:
        assert same_bits(dev, host)
        assert sorted(moved) == payloads(params, sizes)  # each part's payload, once; never the value


@pytest.mark.parametrize("params", PULL_PARAMS)
def test_a_compressed_dist_pushpull_of_device_arrays_moves_only_payloads_both_ways(device, params):
    n = 20000
    grads = gradients(n, np.float32, steps=2, seed=3)

    def body(kv: Any) -> Any:
        kv.init(["h", "d"], [np.zeros(n, np.float32)] * 2)
        kv.set_gradient_compression(params)
        seen = []
        for g in grads:
            host = np.empty(n, np.float32)
            kv.pushpull("h", g, host)
            seen.append((host, *pulled(kv, "d", n, device.moved, push=g)))
        return seen, [p.size for p in kv.meta["d"].parts]

    seen, sizes = run_dist(body)
    for host, dev, moved in seen:
        assert same_bits(dev, host)
        assert sorted(m for m in moved if m[0] == "to device") == payloads(params, sizes)
        assert sorted(m for m in moved if m[0] == "to host") == [
            ("to host", b) for _, b in payloads(params, sizes)
        ]  # the push: each part encoded on the device, its payload copied down


@pytest.mark.parametrize("params", PULL_PARAMS)
def test_a_compressed_local_pull_and_pushpull_into_a_device_array_move_up_only_the_payload(device, params):
    n = 20000
    kv = local_store()
    kv.init(["h", "d"], [np.zeros(n, np.float32)] * 2)
    kv.set_gradient_compression(params)
    for g in gradients(n, np.float32, steps=2, seed=5):
        kv.push(["h", "d"], [g, on_device(g)])  # "d" keeps its residual on the "device"
        host = np.empty(n, np.float32)
        kv.pull("h", host)
        dev, moved = pulled(kv, "d", n, device.moved)
        assert same_bits(dev, host) and moved == payloads(params, [n])
        kv.pushpull("h", g, host)
        dev, moved = pulled(kv, "d", n, device.moved, push=g)
        assert same_bits(dev, host)
        assert [m for m in moved if m[0] == "to device"] == payloads(params, [n])


def test_a_compressed_pull_into_several_outputs_decodes_once_on_their_device(device):
    n, params = 20000, PULL_PARAMS[0]
    g = gradients(n, np.float32, steps=1, seed=7)[0]

    def body(kv: Any) -> Any:
        kv.init("w", np.zeros(n, np.float32))
        kv.set_gradient_compression(params)
        kv.push("w", g)
        host = np.empty(n, np.float32)
        kv.pull("w", host)
        seen = []
        for kinds in (["d", "d"], ["d", "h"]):  # two "GPUs"; a GPU and the host
            outs = [
                on_device(np.zeros(n, np.float32)) if c == "d" else np.zeros(n, np.float32) for c in kinds
            ]
            device.moved.clear()
            kv.pull("w", outs)
            seen.append(([o.view(np.ndarray).copy() for o in outs], list(device.moved)))
        return host, seen, [p.size for p in kv.meta["w"].parts]

    host, ((two, moved_two), (mixed, moved_mixed)), sizes = run_dist(body)
    assert all(same_bits(o, host) for o in two + mixed)
    # on one device: the payloads decoded into the first output, copied on the device to the second
    assert sorted(moved_two) == sorted([*payloads(params, sizes), ("device copy", 4 * n)])
    # a host output among them: decoded on the host, the value copied up once
    assert moved_mixed == [("to device", 4 * n)]


@pytest.mark.parametrize("shm", [False, True])
def test_an_uncompressed_dist_pull_into_a_device_array_moves_each_part_up_once(device, shm):
    n, small = 20000, 10
    g = np.linspace(-1, 1, n, dtype=np.float32)

    def body(kv: Any) -> Any:
        kv.init(["w", "b"], [np.zeros(n, np.float32), np.zeros(small, np.float32)])
        kv.push(["w", "b"], [g, g[:small]])
        host = np.empty(n, np.float32)
        kv.pull("w", host)
        dev, moved = pulled(kv, "w", n, device.moved)
        one, moved_one = pulled(kv, "b", small, device.moved)
        return host, dev, moved, one, moved_one, [p.size for p in kv.meta["w"].parts]

    host, dev, moved, one, moved_one, sizes = run_dist(body, shm=shm)
    assert len(sizes) == 2 and same_bits(dev, host) and same_bits(one, g[:small])
    # each part straight from where it arrived into its slice: no full-size host or device temporary
    assert sorted(moved) == sorted(("to device", 4 * s) for s in sizes)
    assert moved_one == [("to device", 4 * small)]


def test_an_uncompressed_local_pull_into_a_device_array_moves_the_value_up_once(device):
    n = 5000
    kv = local_store()
    kv.init("w", np.zeros(n, np.float32))
    g = np.linspace(-1, 1, n, dtype=np.float32)
    kv.push("w", g)
    dev, moved = pulled(kv, "w", n, device.moved)
    assert same_bits(dev, g) and moved == [("to device", 4 * n)]  # no temporary copy on the device
    wide = on_device(np.zeros(n, np.float64))  # another dtype: converted on the device, values kept
    kv.pull("w", wide)
    assert same_bits(wide.view(np.ndarray), g.astype(np.float64))


# -- on a GPU ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_cuda_source_compiles_with_nvrtc(dtype):
    pytest.importorskip("cupy")
    nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc")
    prog = nvrtc.createProgram(_cuda.source(dtype), "k.cu", [], [])
    try:
        # with the options cupy adds (-ftz=true among them: no float32 operation may flush all the same)
        cupy_adds = ["-std=c++17", "-ftz=true", "--device-as-default-execution-space"]
        nvrtc.compileProgram(prog, ["--gpu-architecture=compute_75", *_cuda.OPTIONS, *cupy_adds])
    except Exception:
        pytest.fail(nvrtc.getProgramLog(prog))
    ptx = nvrtc.getPTX(prog).decode()
    assert all(name in ptx for name in _cuda.NAMES)
    assert ".ftz" not in ptx and "fma" not in ptx


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [*SIZES, 2**20 + 13])
@pytest.mark.parametrize(
    "params",
    [
        {"type": "2bit", "threshold": 0.5},
        {"type": "1bit"},
        {"type": "1bit", "block_size": 64},
        {"type": "topk", "ratio": 0.01},
        {"type": "topk", "ratio": 0.5},
    ],
)
def test_on_a_gpu_the_kernels_are_byte_identical_to_the_host_kernels(dtype, n, params):
    cupy = gpu()
    kernels._cuda_built.clear()
    host, dev = get_compressor(params), get_compressor(params)
    grads = [subnormal(n, dtype), *gradients(n, dtype), tied(n, dtype, 1)]
    for g in grads:
        want, meta = host.encode(g)
        got, dmeta = dev.encode(cupy.asarray(g))
        assert isinstance(got, cupy.ndarray) and dmeta == meta
        assert same_bits(cupy.asnumpy(got), want)
        assert same_bits(cupy.asnumpy(dev.residual), host.residual)
        out = cupy.zeros(n, dtype)
        dev.decode(want, meta, n, dtype, out=out)  # a host payload: sent up, unpacked on the device
        assert same_bits(cupy.asnumpy(out), host.decode(want, meta, n, dtype))
        assert same_bits(cupy.asnumpy(dev.decode(got, meta, n, dtype)), cupy.asnumpy(out))
    assert kernels._cuda_built.get(np.dtype(dtype).name) is not None  # the CUDA kernels ran


@pytest.mark.parametrize("block", sorted(ORDER))
def test_on_a_gpu_1bit_means_follow_the_host_summation_order(block):
    cupy = gpu()
    g = np.array(ORDER[block] * 3, np.float32)
    want, _ = get_compressor({"type": "1bit", "block_size": block}).encode(g)
    got, _ = get_compressor({"type": "1bit", "block_size": block}).encode(cupy.asarray(g))
    assert same_bits(cupy.asnumpy(got), want)


def test_on_a_gpu_the_codec_copies_only_the_payload(monkeypatch):
    cupy = gpu()
    staged: list[int] = []
    real = xpmod.pinned_empty
    monkeypatch.setattr(xpmod, "pinned_empty", lambda n: (staged.append(n), real(n))[1])

    def no_full_copy(x: Any) -> Any:
        raise AssertionError(f"a copy of {x.nbytes} bytes to the host")

    monkeypatch.setattr(xpmod, "to_host", no_full_copy)
    monkeypatch.setattr(cupy, "asnumpy", no_full_copy)
    codec = WorkerCodec()
    codec.set_params({"type": "1bit"})
    payload, _ = codec.encode("w", 0, cupy.asarray(gradients(1 << 20, np.float32)[0]))
    assert type(payload) is np.ndarray and staged == [payload.nbytes] == [onebit.wire_bytes(1 << 20)]
