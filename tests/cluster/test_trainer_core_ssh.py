"""trainer_core's KV store launched over ssh on three network-namespace hosts: arrays cross real
(veth) links on the TCP data channel, and share memory where a worker and a server share a host."""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.cluster.conftest import netns_hosts, netns_session  # noqa: F401
from tests.launchkit.procs import run

ROOT = Path(__file__).resolve().parents[2]
# /var/tmp is shared with the namespace hosts (their /root, /tmp, /srv, /dev/shm are private)
HOST_VENV = Path("/var/tmp/launchkit-test-venv-tc")
NEEDS = "import numpy, zmq"

PROG = """
import json
import numpy as np
from trainer_core import kv as kvmod

kv = kvmod.create('dist_sync')
n = 1_000_000  # >= MXNET_KVSTORE_BIGARRAY_BOUND: split over both servers
kv.init('big', np.zeros(n, np.float32))
kv.init('small', np.zeros(5, np.float64))
c = kv.client
out, res = np.empty(n, np.float32), {}
for rnd in range(3):
    a = np.arange(n, dtype=np.float32) * (kv.rank + 1) + rnd
    kv.push('big', a)
    a[:] = -1.0  # reusable as soon as push returns
    kv.pull('big', out)
    res[f'big/{rnd}'] = bool(np.array_equal(out, np.arange(n, dtype=np.float32) * 3 + 2 * rnd))
    s = np.full(5, kv.rank + 0.25)
    kv.pushpull('small', s)
    res[f'small/{rnd}'] = s.tolist()
print(json.dumps({'rank': kv.rank, 'res': res, 'tcp': [t is not None for t in c.tcp],
                  'shm': [bool(x) for x in c.same_host]}), flush=True)
kv.close()
"""


@pytest.fixture(scope="session")
def host_python() -> str:
    """A python the namespace hosts can run with numpy and pyzmq: a venv of Debian's python3 in
    /var/tmp, made once (pip install numpy pyzmq)."""
    py = HOST_VENV / "bin" / "python"
    HOST_VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{HOST_VENV}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not py.exists() or subprocess.run([str(py), "-c", NEEDS], capture_output=True).returncode != 0:
            base = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else "python3"
            for argv in (
                [base, "-m", "venv", "--clear", str(HOST_VENV)],
                [str(py), "-m", "pip", "install", "-q", "numpy", "pyzmq"],
                [str(py), "-c", NEEDS],
            ):
                res = subprocess.run(argv, capture_output=True, text=True, timeout=400)
                assert res.returncode == 0, f"could not set up {HOST_VENV}: {argv}: {res.stderr[-2000:]}"
    return str(py)


@pytest.mark.timeout(480)
def test_dist_sync_across_namespace_hosts_over_ssh(netns_hosts, host_python: str, tmp_path: Path) -> None:  # noqa: F811
    group = netns_hosts(3)
    job = tmp_path / "job"
    job.mkdir()
    for pkg in ("trainer_core", "dmlc_env"):  # trainer_core needs the env contract, not launchkit
        shutil.copytree(ROOT / pkg, job / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (job / "prog.py").write_text(PROG)
    hostfile = group.write_hostfile(tmp_path / "hosts")
    res = run(
        [
            "launch",
            "-n",
            "2",
            "-s",
            "2",
            "-H",
            str(hostfile),
            "-i",
            str(group.identity),
            "--known-hosts",
            str(group.known_hosts),
            "--sync-dst-dir",
            "/srv/tcjob",
            host_python,
            "prog.py",
        ],
        cwd=job,
        timeout=180,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = [
        json.loads(line.split("] ", 1)[1])
        for line in res.stdout.splitlines()
        if line.startswith("[worker") and "{" in line
    ]
    assert sorted(o["rank"] for o in out) == [0, 1], res.stdout[-3000:]
    for o in out:
        for rnd in range(3):
            assert o["res"][f"big/{rnd}"] is True
            assert o["res"][f"small/{rnd}"] == [1.5] * 5
    # placed as MXNet places them: server i on host i, workers round-robin from host 3, so one
    # worker shares a host with a server (shared memory) and every other pair crosses a link (TCP)
    channels = sorted((o["tcp"], o["shm"]) for o in out)
    assert channels == [([False, True], [True, False]), ([True, True], [False, False])], channels
    for h in group:  # nothing left in the hosts' shared memory
        assert "launchkit" not in h.run("ls /dev/shm").stdout
