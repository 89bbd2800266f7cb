"""Which compression kernels run and when they compile (compression/kernels.py, compression/_fast*.py).

Each case runs in a fresh Python process with its own numba cache directory, so that "compiled"
and "loaded from the cache" mean what they say: the line saying which kernels run (once per
process; the numpy fallback and why when numba cannot be imported), warming when compression is
set up so that the first push compiles nothing, two processes warming at once compiling once,
and the cache of a read-only install (a read-only bind mount in a private mount namespace).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainer_core.compression import _fast

REPO = Path(__file__).resolve().parents[2]
needs_numba = pytest.mark.skipif(not _fast.available(), reason="numba not installed")


def run_py(
    code: str, env: dict[str, str] | None = None, path: Path = REPO, timeout: float = 120
) -> tuple[str, str]:
    """Run ``code`` in a fresh interpreter with ``path`` first on sys.path; (stdout, stderr)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    full.update(env or {})
    full["PYTHONPATH"] = str(path)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=path,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, proc.stderr


KERNEL_LINE = "trainer_core compression: "


@needs_numba
@pytest.mark.slow  # (each of these compiles kernels into a cache of its own: seconds of CPU)
def test_one_line_says_the_compiled_kernels_run(tmp_path: Path) -> None:
    _, err = run_py(
        """
        import numpy as np
        from trainer_core.compression import get_compressor
        for params in ({"type": "2bit"}, {"type": "1bit"}, {"type": "topk"}, {"type": "2bit"}):
            c = get_compressor(params)
            p, m = c.encode(np.ones(100, np.float32))
            c.decode(p, m, 100, np.float32)
        """,
        {"NUMBA_CACHE_DIR": str(tmp_path)},
    )
    lines = [ln for ln in err.splitlines() if KERNEL_LINE in ln]
    assert len(lines) == 1, err
    assert f"compiled numba {_fast.numba.__version__} kernels (on-disk cache)" in lines[0]


def test_without_numba_the_numpy_kernels_run_and_the_line_says_why(tmp_path: Path) -> None:
    out, err = run_py(
        """
        import sys
        sys.modules["numba"] = None  # import numba raises ImportError, as where it has no wheel
        import numpy as np
        from trainer_core.compression import get_compressor, kernels
        kernels.warm({"type": "2bit", "threshold": 0.5})
        c = get_compressor({"type": "2bit", "threshold": 0.5})
        p, m = c.encode(np.array([1.0, -1.0, 0.1, 0.7], np.float32))
        print(c.decode(p, m, 4, np.float32).tolist())
        """,
        {"NUMBA_CACHE_DIR": str(tmp_path)},
    )
    assert out.strip() == "[0.5, -0.5, 0.0, 0.5]"
    lines = [ln for ln in err.splitlines() if KERNEL_LINE in ln]
    assert len(lines) == 1, err
    assert "numpy kernels (numba cannot be imported: " in lines[0] and "pip install numba" in lines[0]


# a worker of the in-process job (tests/trainer_core/test_ps_client.py): counts of compiled and
# cached signatures before and after ``set_gradient_compression``, and after the first push and pull
WARM_THEN_PUSH = """
import json
import numpy as np
from tests.trainer_core.test_ps_client import InProcessJob, run_workers
from trainer_core.compression import _fast, kernels

seen = {}

def body(kv):
    kv.init("w", np.zeros(20000, np.float32))
    if kv.rank == 0:
        seen["before"] = [len(k.signatures) for k in _fast.kernels()]
    kv.set_gradient_compression(PARAMS)
    if kv.rank == 0:
        seen["warmed"] = [len(k.signatures) for k in _fast.kernels()]
        seen["counts"] = kernels.compile_counts()
    out = np.empty(20000, np.float32)
    kv.push("w", np.linspace(-1, 1, 20000, dtype=np.float32))
    kv.pull("w", out)
    kv.barrier()
    if kv.rank == 0:
        seen["pushed"] = [len(k.signatures) for k in _fast.kernels()]
        seen["counts_after"] = kernels.compile_counts()

j = InProcessJob(2, 2)
try:
    run_workers(j, "dist_sync", body)
finally:
    j.stop()
print(json.dumps(seen))
"""


@needs_numba
@pytest.mark.parametrize(
    "params",
    [
        {"type": "2bit", "threshold": 0.5},
        pytest.param({"type": "1bit"}, marks=pytest.mark.slow),
        pytest.param({"type": "topk"}, marks=pytest.mark.slow),
    ],
)
def test_set_gradient_compression_warms_the_kernels_so_the_first_push_compiles_nothing(
    tmp_path: Path, params: dict
) -> None:
    out, err = run_py(f"PARAMS = {params!r}\n" + WARM_THEN_PUSH, {"NUMBA_CACHE_DIR": str(tmp_path)})
    seen = json.loads(out)
    assert sum(seen["before"]) == 0
    assert sum(seen["warmed"]) > 0  # compiled by set_gradient_compression
    assert seen["counts"][0] > 0  # ... and really compiled (a fresh cache directory)
    assert seen["pushed"] == seen["warmed"] and seen["counts_after"] == seen["counts"]
    assert f"{params['type']} kernels ready in" in err


TWO_AT_ONCE = """
import json, os, sys, time
from pathlib import Path
go = Path(sys.argv[1])
from trainer_core.compression import kernels
import numba  # imported before the start, so both processes reach warm together
Path(str(go) + "." + sys.argv[2]).touch()
while not go.exists():
    time.sleep(0.001)
kernels.warm({"type": "1bit"})
print(json.dumps(kernels.compile_counts()))
"""


@needs_numba
@pytest.mark.slow
def test_two_processes_warming_at_once_compile_only_once(tmp_path: Path) -> None:
    cache, go = tmp_path / "cache", tmp_path / "go"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env.update(NUMBA_CACHE_DIR=str(cache), PYTHONPATH=str(REPO))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", TWO_AT_ONCE, str(go), str(i)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        for i in range(2):
            ready = Path(f"{go}.{i}")
            for _ in range(60000):
                if ready.exists() or procs[i].poll() is not None:
                    break
                subprocess.run(["sleep", "0.001"], check=False)
        go.touch()
        results = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs), results
    counts = sorted(tuple(json.loads(out)) for out, _ in results)
    assert counts == [(0, 7), (7, 0)]  # one compiled the seven kernels; the other loaded them


def can_bind_mount_read_only() -> bool:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, check=False)
    return probe.returncode == 0


READ_ONLY_RUN = """
set -e
mount --bind -o ro {src} {mnt}
if touch {mnt}/probe 2>/dev/null; then echo "mount is writable"; exit 3; fi
{extra}
cd {mnt}
HOME={home} PYTHONPATH={mnt} {python} -c '{code}'
"""

READ_ONLY_CODE = (
    "import json; from trainer_core.compression import _fast, kernels; "
    'kernels.warm({"type": "2bit"}); '
    "print(json.dumps([kernels.compile_counts(), _fast.CACHE_ERROR, _fast.twobit_encode.stats.cache_path]))"
)


@needs_numba
@pytest.mark.slow
@pytest.mark.skipif(
    not can_bind_mount_read_only(), reason="needs root and unshare -m for a read-only bind mount"
)
def test_a_read_only_install_caches_the_kernels_in_the_users_cache_directory(tmp_path: Path) -> None:
    src, mnt, home = tmp_path / "src", tmp_path / "mnt", tmp_path / "home"
    mnt.mkdir()
    home.mkdir()
    shutil.copytree(REPO / "trainer_core", src / "trainer_core", ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "XDG_"))}

    def run(extra: str = "") -> list:
        script = READ_ONLY_RUN.format(
            src=src, mnt=mnt, home=home, python=sys.executable, code=READ_ONLY_CODE, extra=extra
        )
        proc = subprocess.run(
            ["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=env, timeout=120
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return json.loads(proc.stdout.splitlines()[-1])

    first, second = run(), run()
    assert first[0][0] == 2 and second[0] == [0, 2]  # compiled once, then loaded from the cache
    assert first[1] is None and Path(first[2]).is_relative_to(home / ".cache" / "numba")
    assert list((home / ".cache" / "numba").rglob("*.nbi")) and not list(src.rglob("*.nbi"))
    # nothing writable at all: no cache, but the compiled kernels still run
    no_cache = run(extra=f"mount --bind -o ro {home} {home}")
    assert no_cache[0][0] == 2 and "no locator available" in no_cache[1]


@needs_numba
def test_a_server_warms_the_kernels_when_the_setting_reaches_it(tmp_path: Path) -> None:
    """The server's store (what ``set_compression`` of a received setting calls) compiles at once."""
    out, err = run_py(
        """
        import json
        from trainer_core.compression import _fast
        from trainer_core.ps.store import Store
        store = Store(2)
        before = sum(len(k.signatures) for k in _fast.kernels())
        store.set_compression({"type": "2bit", "threshold": 0.5})
        print(json.dumps([before, sum(len(k.signatures) for k in _fast.kernels())]))
        """,
        {"NUMBA_CACHE_DIR": str(tmp_path)},
    )
    assert json.loads(out) == [0, 2]  # encode (pulls) and decode (pushes)
    assert "2bit kernels ready in" in err and "(compiled 2)" in err
