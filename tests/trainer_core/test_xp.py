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


# the CUDA driver's library, as this machine has it or not: loading it is all xp does with it
NO_DRIVER = (
    "import ctypes\n"
    "class _CDLL(ctypes.CDLL):\n"
    "    def __init__(self, name, *a, **kw):\n"
    "        if name == 'libcuda.so.1':\n"
    "            raise OSError('libcuda.so.1: cannot open shared object file: No such file or directory')\n"
    "        super().__init__(name, *a, **kw)\n"
    "ctypes.CDLL = _CDLL\n"
)
DRIVER = "import ctypes\nreal = ctypes.CDLL\nctypes.CDLL = lambda name, *a, **kw: object() if name == 'libcuda.so.1' else real(name, *a, **kw)\n"
IMPORTS = "class cuda:\n    class runtime:\n        pass\nclass ndarray:\n    pass\n"

BROKEN = {  # case -> (cupy/__init__.py, prelude, the error named)
    "no_driver": (
        IMPORTS,
        NO_DRIVER,
        "OSError: libcuda.so.1: cannot open shared object file: No such file or directory",
    ),
    "import_fails": (
        "raise ImportError('CuPy is not correctly installed: libcudart.so.12: cannot open shared object file')\n",
        DRIVER,
        "ImportError: CuPy is not correctly installed: libcudart.so.12: cannot open shared object file",
    ),
    "dependency_missing": (
        "import fastrlock_not_there\n",
        DRIVER,
        "ModuleNotFoundError: No module named 'fastrlock_not_there'",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_cupy_warns_once_naming_the_error(tmp_path: Path, case: str) -> None:
    init, prelude, error = BROKEN[case]
    res = probe(tmp_path, init, prelude)
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


@pytest.mark.parametrize(
    ("init", "prelude"),
    [(IMPORTS, DRIVER), (IMPORTS.replace("pass", "is_hip = True", 1), NO_DRIVER)],  # CUDA; ROCm (no libcuda)
)
def test_working_cupy_is_used(tmp_path: Path, init: str, prelude: str) -> None:
    (tmp_path / "cupy").mkdir()
    (tmp_path / "cupy" / "__init__.py").write_text(init)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    code = (
        prelude
        + "import trainer_core.xp as xp, cupy\nassert xp._cupy is cupy\nassert xp.is_device_array(cupy.ndarray())\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0 and res.stderr == "", res.stderr
