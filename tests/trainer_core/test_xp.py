"""trainer_core.xp's choice of array module: a cupy that is installed but broken says so (once,
naming the error) instead of silently leaving arrays on the CPU; a cupy that is simply not
installed says nothing. Each case runs in a fresh interpreter with a fake ``cupy`` package first
on sys.path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = (
    "import numpy as np\n"
    "import trainer_core.xp as xp, trainer_core.kv, trainer_core.compression\n"  # more importers of xp
    "assert xp.array_module(np.zeros(1)) is np and xp._cupy is None\n"
    "print('numpy')\n"
)


def probe(tmp_path: Path, cupy_init: str | None, prelude: str = "") -> subprocess.CompletedProcess[str]:
    if cupy_init is not None:
        (tmp_path / "cupy").mkdir()
        (tmp_path / "cupy" / "__init__.py").write_text(cupy_init)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    env.pop("PS_VERBOSE", None)
    return subprocess.run(
        [sys.executable, "-c", prelude + PROBE],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=tmp_path,
    )


BROKEN = {
    "no_driver": (
        "class CUDARuntimeError(RuntimeError):\n    pass\n"
        "class runtime:\n"
        "    @staticmethod\n"
        "    def getDeviceCount():\n"
        "        raise CUDARuntimeError('cudaErrorInsufficientDriver: CUDA driver version is insufficient')\n"
        "class cuda:\n    runtime = runtime\n"
        "class ndarray:\n    pass\n",
        "CUDARuntimeError: cudaErrorInsufficientDriver: CUDA driver version is insufficient",
    ),
    "no_device": (
        "class cuda:\n    class runtime:\n        getDeviceCount = staticmethod(lambda: 0)\n"
        "class ndarray:\n    pass\n",
        "RuntimeError: no CUDA device found",
    ),
    "import_fails": (
        "raise ImportError('CuPy is not correctly installed: libcudart.so.12: cannot open shared object file')\n",
        "ImportError: CuPy is not correctly installed: libcudart.so.12: cannot open shared object file",
    ),
    "dependency_missing": (
        "import fastrlock_not_there\n",
        "ModuleNotFoundError: No module named 'fastrlock_not_there'",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_cupy_warns_once_naming_the_error(tmp_path: Path, case: str) -> None:
    init, error = BROKEN[case]
    res = probe(tmp_path, init)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "numpy"
    line = f"trainer_core: cupy is installed but cannot be used ({error}); arrays stay on the CPU (numpy)"
    assert res.stderr.count(line) == 1, res.stderr
    assert res.stderr.count("cupy") == res.stderr.count(line), res.stderr  # nothing else about it


def test_cupy_not_installed_is_quiet(tmp_path: Path) -> None:
    res = probe(tmp_path, None, prelude="import sys\nsys.modules['cupy'] = None\n")  # import cupy: not found
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "numpy"
    assert "cupy" not in res.stderr


def test_working_cupy_is_used(tmp_path: Path) -> None:
    init = "class cuda:\n    class runtime:\n        getDeviceCount = staticmethod(lambda: 1)\nclass ndarray:\n    pass\n"
    (tmp_path / "cupy").mkdir()
    (tmp_path / "cupy" / "__init__.py").write_text(init)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    code = "import trainer_core.xp as xp, cupy\nassert xp._cupy is cupy\nassert xp.is_device_array(cupy.ndarray())\n"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0 and res.stderr == "", res.stderr
