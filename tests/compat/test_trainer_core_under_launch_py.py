"""trainer_core started by MXNet's own ``tools/launch.py`` (dmlc-core's tracker), not by launchkit.

The tracker sets only the ``DMLC_*`` variables (and runs the scheduler itself, with
``DMLC_ROLE=scheduler``); the job secret comes from the user's environment, as any other setting
a user exports before ``launch.py``. trainer_core must run from that alone.

MXNet 1.9.1's tracker calls ``Thread.isAlive``, which Python 3.9 removed, so ``launch.py`` dies
with an AttributeError on any current Python (its scheduler thread is left running); the test
restores that one name before running ``launch.py`` unchanged.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROG = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import trainer_core.kv  # scheduler and servers run their role on import and exit here
    kv = trainer_core.kv.create("dist_sync")
    kv.init(7, np.zeros(100, np.float32))
    kv.push(7, np.full(100, kv.rank + 1, np.float32))
    out = np.empty(100, np.float32)
    kv.pull(7, out=out)
    print("RESULT " + json.dumps({"rank": kv.rank, "sum": float(out.sum()), "launchkit": "launchkit" in sys.modules}), flush=True)
    kv.close()
    """
)


def launch_py(mxnet_python: str) -> str:
    res = subprocess.run(
        [
            mxnet_python,
            "-c",
            "import importlib.util as u; print(u.find_spec('mxnet').submodule_search_locations[0])",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    path = Path(res.stdout.strip()) / "tools" / "launch.py"
    assert path.exists(), f"MXNet's wheel has no {path}"
    return str(path)


@pytest.mark.timeout(120)
def test_dist_sync_under_mxnet_launch_py(mxnet_python: str, tmp_path: Path) -> None:
    prog = tmp_path / "prog.py"
    prog.write_text(PROG)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "LAUNCHKIT_JOB_SECRET": secrets.token_hex(16),
        "PS_HEARTBEAT_INTERVAL": "0.3",
        "PS_HEARTBEAT_TIMEOUT": "3",
    }
    args = [launch_py(mxnet_python), "-n", "2", "-s", "2", "--launcher", "local", sys.executable, str(prog)]
    run = (
        "import runpy, sys, threading; threading.Thread.isAlive = threading.Thread.is_alive; "
        f"sys.argv = {args!r}; runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    proc = subprocess.Popen(
        [mxnet_python, "-c", run],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=90)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the tracker's children, whatever happened
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    # every process writes to the tracker's one stdout: read each result wherever its line landed
    results = [json.loads(m) for m in re.findall(r"RESULT (\{[^}]*\})", out)]
    assert sorted(r["rank"] for r in results) == [0, 1], out
    assert all(r["sum"] == 100 * (1 + 2) for r in results), results
    assert not any(r["launchkit"] for r in results)
