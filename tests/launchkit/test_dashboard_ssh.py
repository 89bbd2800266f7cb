"""The dashboard of a job over ssh (real sshd on loopback): the remote process's row gets its
CPU and memory, and the host its figures, from the host's watchdog, in the job's live file and
in ``launchkit top`` from another terminal."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

from launchkit import launching
from launchkit.backends.ssh.backend import SshBackend
from launchkit.backends.ssh.options import SshOptions
from launchkit.console import Ui
from launchkit.core.spec import Host, JobResult, LaunchSpec
from launchkit.jobs import live
from tests.cluster.conftest import sshd_loopback  # noqa: F401
from tests.launchkit.procs import job_ids, run, wait_until

# busy until the test has seen what it looks for (the STOP file), at most 60 s
BUSY = "import os, sys, time\nt = time.time()\nwhile not os.path.exists(sys.argv[1]) and time.time() - t < 60: pass"


def test_remote_rows_and_host_figures_in_the_live_view(sshd_loopback, launchkit_home, tmp_path: Path) -> None:  # noqa: F811
    host = Host(sshd_loopback.host, port=sshd_loopback.port, user=sshd_loopback.user)
    backend = SshBackend(SshOptions(identity=str(sshd_loopback.identity), known_hosts=str(tmp_path / "kh")))
    stop = Path(f"/tmp/lk-dash-ssh-{uuid.uuid4().hex[:8]}")  # /tmp: the remote user can see it
    spec = LaunchSpec(
        num_workers=1,
        num_servers=0,
        command=("python3", "-c", BUSY, str(stop)),
        hosts=(host,),
        backend="ssh",
        cwd="/tmp",
    )
    results: list[JobResult] = []
    job = threading.Thread(target=lambda: results.append(launching.run_job(spec, backend, Ui())))
    job.start()
    try:
        seen: dict[str, object] = {}

        def remote_row_sampled() -> bool:
            ids = job_ids(launchkit_home)
            view = live.read(ids[-1])[0] if ids else None
            rows = [r for r in view.state.rows if r.role == "worker"] if view else []
            if rows and rows[0].cpu_percent is not None and rows[0].cpu_percent > 20:
                seen.update(job=ids[-1], row=rows[0], training=view.state.training)
                return True
            return False

        assert wait_until(remote_row_sampled, 20, interval=0.2)
        row, training = seen["row"], seen["training"]
        assert row.host == str(host) and row.rss_bytes and row.rss_bytes > 0  # type: ignore[attr-defined]
        assert training is not None and str(host) in {h.host for h in training.hosts}  # type: ignore[attr-defined]
        res = run(["top", str(seen["job"]), "--once"])
        assert res.returncode == 0, res.stderr
        worker = next(line for line in res.stdout.splitlines() if "worker" in line and "running" in line)
        assert str(host) in worker and "%" in worker and "MiB" in worker
    finally:
        stop.touch()
        job.join(timeout=60)
        stop.unlink()
    assert results and results[0].exit_code == 0
