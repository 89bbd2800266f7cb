"""A plain torch DDP script (``DistributedDataParallel``, gloo, ``env://``: it never imports
trainer_core or launchkit) under ``launchkit launch -n 4 -s 0`` over ssh on three namespace hosts:
every rank ends with the parameters of one process trained on the concatenated batches; a worker
SIGKILLed mid-training fails the job naming its rank and host; a SIGKILL of the launcher itself.
After each, nothing of the job is left on any host.

The hosts run the fixture's Debian python with this interpreter's site-packages (torch) on
``PYTHONPATH``: the namespace hosts have a private /root and /tmp, so the checkout's venv python
(often a link into /root) cannot run there; its packages can, from where they are, or from a copy
in /var/tmp where the checkout lies under /root or /tmp (a fresh machine's /root/project). Gloo takes the
address its host name resolves to, 127.0.0.1 on these hosts, unless ``GLOO_SOCKET_IFNAME`` names the
interface (as on any cluster whose host names resolve to loopback: docs/pytorch.md).
"""

from __future__ import annotations

import fcntl
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster.conftest import netns_hosts, netns_session  # noqa: F401
from tests.cluster.test_trainer_core_ssh import host_python  # noqa: F401
from tests.launchkit.procs import parse_prefixed, run, start, wait_for_job, wait_until

torch = pytest.importorskip("torch", reason="the torch extra: pip install -e '.[torch]'")

SITE = Path(torch.__file__).resolve().parents[1]
WORKERS, STEPS, BATCH = 4, 6, 4

PROG = """
import json, os, signal, sys, time
import torch
import torch.distributed as dist

dist.init_process_group(backend="gloo")  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
rank, size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
mode = sys.argv[1]
steps = int(sys.argv[2]) if mode == "train" else 10**9
for step in range(steps):
    g = torch.Generator().manual_seed(1000 * rank + step)
    x, y = torch.randn(4, 8, generator=g), torch.randn(4, 3, generator=g)
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()
    if mode != "train" and step == 1:
        print(json.dumps({"rank": rank, "running": os.getpid()}), flush=True)
    if mode == "kill" and step == 3 and rank == int(sys.argv[2]):
        os.kill(os.getpid(), signal.SIGKILL)
    if mode != "train":
        time.sleep(0.02)
params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
print(json.dumps({"rank": rank, "size": size, "params": params.tolist()}), flush=True)
dist.barrier()  # no rank tears gloo down while another still talks to it (it aborts then)
dist.destroy_process_group()
"""


PRIVATE = ("/root/", "/tmp/")  # each namespace host has its own (tests/cluster/netns.py)
SITE_COPY = Path("/var/tmp/launchkit-test-torch-site")


@pytest.fixture(scope="session")
def host_site() -> Path:
    """This interpreter's site-packages where the hosts can read them: in place, or a copy (made
    once per torch build) when they lie in a directory the hosts do not share."""
    if not str(SITE).startswith(PRIVATE):
        return SITE
    stamp = f"{SITE} {torch.__version__}\n"
    with open(f"{SITE_COPY}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (SITE_COPY / ".from").exists() or (SITE_COPY / ".from").read_text() != stamp:
            shutil.rmtree(SITE_COPY, ignore_errors=True)
            shutil.copytree(SITE, SITE_COPY, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
            (SITE_COPY / ".from").write_text(stamp)
    return SITE_COPY


@pytest.fixture
def torch_python(host_python: str) -> str:  # noqa: F811
    """The hosts' python, if it is this interpreter's version (so that torch's extension loads)."""
    got = subprocess.run(
        [host_python, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True
    )
    if got.stdout.strip() != str(tuple(sys.version_info[:2])):
        pytest.skip(f"the hosts' python is {got.stdout.strip()}, torch here is for {sys.version_info[:2]}")
    return host_python


def launch_argv(group, tmp_path: Path, python: str, site: Path, *rest: str, ifname: bool = True) -> list[str]:
    job = tmp_path / "job"
    job.mkdir(exist_ok=True)
    (job / "ddp.py").write_text(PROG)
    hostfile = group.write_hostfile(tmp_path / "hosts")
    return [
        "launch",
        "--launcher",
        "ssh",
        "-H",
        str(hostfile),
        "-i",
        str(group.identity),
        "--known-hosts",
        str(group.known_hosts),
        "--sync-dst-dir",
        "/srv/ddpjob",
        "-n",
        str(WORKERS),
        "-s",
        "0",
        "--grace-period",
        "2",
        "--env",
        f"PYTHONPATH:{site}",
        *(["--env", "GLOO_SOCKET_IFNAME:eth0"] if ifname else []),
        python,
        "ddp.py",
        *rest,
    ]


def reference() -> list[float]:
    """One process: the same start, each step on every rank's batch at once (DDP averages the ranks'
    mean-loss gradients: the mean over the concatenated batch)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        xs, ys = [], []
        for rank in range(WORKERS):
            g = torch.Generator().manual_seed(1000 * rank + step)
            xs.append(torch.randn(BATCH, 8, generator=g))
            ys.append(torch.randn(BATCH, 3, generator=g))
        torch.nn.functional.mse_loss(model(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()
        opt.zero_grad()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


def left_on_hosts(group, job_id: str) -> list[int]:
    return [pid for h in group for pid in h.pids_with_env(f"LAUNCHKIT_JOB_ID={job_id}")]


@pytest.mark.timeout(480)
def test_ddp_script_across_three_hosts_a_killed_worker_and_a_killed_launcher(
    netns_hosts,  # noqa: F811
    torch_python: str,
    host_site: Path,
    tmp_path: Path,
    launchkit_home: Path,
) -> None:
    group = netns_hosts(3)
    res = run(
        launch_argv(group, tmp_path, torch_python, host_site, "train", str(STEPS)),
        cwd=tmp_path / "job",
        timeout=200,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    outs = parse_prefixed(res.stdout)
    assert sorted(outs) == [("worker", r) for r in range(WORKERS)], res.stdout[-3000:]
    want = reference()
    for (_, rank), o in outs.items():
        assert o["rank"] == rank and o["size"] == WORKERS
        assert o["params"] == pytest.approx(want, abs=1e-5), f"rank {rank}"
    first = wait_for_job(launchkit_home)
    assert wait_until(lambda: not left_on_hosts(group, first), 10)

    # worker 2 (the third host's) SIGKILLs itself at its fourth step: the job fails naming it
    res = run(
        launch_argv(group, tmp_path, torch_python, host_site, "kill", "2"), cwd=tmp_path / "job", timeout=200
    )
    assert res.returncode == 128 + signal.SIGKILL, res.stderr[-3000:]
    assert f"failed: worker 2 on {group[2].hostfile_line()} was killed by signal 9" in res.stderr
    killed = [j for j in (p.stem for p in (launchkit_home / "jobs").glob("*.json")) if j != first]
    assert len(killed) == 1
    assert wait_until(lambda: not left_on_hosts(group, killed[0]), 15), left_on_hosts(group, killed[0])

    # the launcher SIGKILLed while every rank trains: the hosts' processes end all the same
    proc = start(launch_argv(group, tmp_path, torch_python, host_site, "run"), cwd=tmp_path / "job")
    try:
        running: set[int] = set()
        deadline = time.monotonic() + 120
        assert proc.stdout is not None
        while len(running) < WORKERS and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("[worker ") and '"running"' in line:
                running.add(json.loads(line.partition("] ")[2])["rank"])
        assert running == set(range(WORKERS)), "not every rank started training"
        jobs = {p.stem for p in (launchkit_home / "jobs").glob("*.json")} - {first, killed[0]}
        assert len(jobs) == 1
        job = jobs.pop()
        assert left_on_hosts(group, job), "the job's processes should be running"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert wait_until(lambda: not left_on_hosts(group, job), 30), left_on_hosts(group, job)
    finally:
        proc.kill()
        proc.communicate()


@pytest.mark.timeout(240)
def test_ddp_across_hosts_whose_names_resolve_to_loopback_needs_no_gloo_socket_ifname(
    netns_hosts,  # noqa: F811
    torch_python: str,
    host_site: Path,
    tmp_path: Path,
) -> None:
    """Without --env GLOO_SOCKET_IFNAME the job failed after 21 s with 'Gloo connectFullMesh
    failed ... remote=[127.0.0.1]' (issue 40): each host's watchdog now gives its workers the
    interface toward MASTER_ADDR."""
    group = netns_hosts(3)
    argv = launch_argv(group, tmp_path, torch_python, host_site, "train", str(STEPS), ifname=False)
    res = run(argv, cwd=tmp_path / "job", timeout=200)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    outs = parse_prefixed(res.stdout)
    assert sorted(outs) == [("worker", r) for r in range(WORKERS)], res.stdout[-3000:]
    assert all(o["params"] == pytest.approx(reference(), abs=1e-5) for o in outs.values())
