"""trainer_core without launchkit: a job started by hand with the environment variables alone.

Any launcher that sets the ``DMLC_*`` variables (MXNet's ``tools/launch.py``, a batch script,
a shell loop) must be able to run trainer_core: here every process is started with a bare
environment (the ``DMLC_*`` variables, the job secret, PATH) and with ``launchkit`` made
unimportable, so a stray import of the launcher fails the job.
"""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

NO_LAUNCHKIT = """
import importlib.abc, sys
class NoLaunchkit(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "launchkit" or name.startswith("launchkit."):
            raise ImportError(f"trainer_core imported {name}: it must not depend on the launcher")
        return None
sys.meta_path.insert(0, NoLaunchkit())
"""

WORKER = NO_LAUNCHKIT + textwrap.dedent(
    """
    import json, os
    import numpy as np
    import trainer_core.kv
    kv = trainer_core.kv.create("dist_sync")
    kv.init("w", np.zeros(1000, np.float32))
    kv.push("w", np.full(1000, kv.rank + 1, np.float32))
    out = np.empty(1000, np.float32)
    kv.pull("w", out=out)
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("launchkit", "trainer_core", "dmlc_env"))
    print("RESULT " + json.dumps({"rank": kv.rank, "sum": float(out[0]), "n": kv.num_workers, "mods": loaded}))
    kv.close()
    """
)

ROLE = NO_LAUNCHKIT + "import trainer_core\n"  # scheduler and server run on import, as with `import mxnet`


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(60)
def test_job_started_by_hand_with_the_variables_alone(tmp_path: Path) -> None:
    workers, servers = 2, 2
    common = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "DMLC_PS_ROOT_URI": "127.0.0.1",
        "DMLC_PS_ROOT_PORT": str(free_port()),
        "DMLC_NUM_SERVER": str(servers),
        "DMLC_NUM_WORKER": str(workers),
        "LAUNCHKIT_JOB_SECRET": secrets.token_hex(16),
        "PS_HEARTBEAT_INTERVAL": "0.3",
        "PS_HEARTBEAT_TIMEOUT": "3",
    }
    roles = ["scheduler"] + ["server"] * servers + ["worker"] * workers
    procs = []
    try:
        for i, role in enumerate(roles):
            prog = WORKER if role == "worker" else ROLE
            log = (tmp_path / f"{role}{i}.log").open("wb")
            env = {**common, "DMLC_ROLE": role}
            procs.append(
                (
                    role,
                    subprocess.Popen(
                        [sys.executable, "-c", prog], env=env, stdout=log, stderr=subprocess.STDOUT
                    ),
                )
            )
        codes = [p.wait(timeout=45) for _, p in procs]
    finally:
        for _, p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    logs = {f.name: f.read_text() for f in sorted(tmp_path.glob("*.log"))}
    assert codes == [0] * len(roles), logs
    results = [
        json.loads(line[7:])
        for text in logs.values()
        for line in text.splitlines()
        if line.startswith("RESULT ")
    ]
    assert sorted(r["rank"] for r in results) == list(range(workers))
    assert all(r["sum"] == 1 + 2 and r["n"] == workers for r in results), results
    assert all(not any(m.startswith("launchkit") for m in r["mods"]) for r in results)
    assert all("dmlc_env" in r["mods"] for r in results)  # the contract, read without the launcher
