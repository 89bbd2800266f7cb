"""The metrics endpoint gets an ssh host's figures and its processes' usage from the watchdog's
heartbeats (real sshd on loopback, in-process launch)."""

from __future__ import annotations

from pathlib import Path

from launchkit import launching
from launchkit.backends.ssh.backend import SshBackend
from launchkit.backends.ssh.options import SshOptions
from launchkit.console import Ui
from launchkit.core.spec import Host, LaunchSpec
from launchkit.telemetry.endpoint import Telemetry

BUSY = "import time\nt = time.time()\nwhile time.time() - t < 4: pass"


def test_remote_rows_get_host_figures_and_process_usage(sshd_loopback, tmp_path: Path, monkeypatch) -> None:
    served: list[Telemetry] = []
    real = launching.serve

    def spy(*args, **kwargs):
        served.append(real(*args, **kwargs))
        return served[-1]

    monkeypatch.setattr(launching, "serve", spy)
    host = Host(sshd_loopback.host, port=sshd_loopback.port, user=sshd_loopback.user)
    backend = SshBackend(SshOptions(identity=str(sshd_loopback.identity), known_hosts=str(tmp_path / "kh")))
    spec = LaunchSpec(num_workers=1, num_servers=0, command=("python3", "-c", BUSY), hosts=(host,),
                      backend="ssh", cwd="/tmp")  # fmt: skip
    result = launching.run_job(spec, backend, Ui())
    assert result.exit_code == 0
    model = served[0].model
    remote = model.hosts[str(host)].latest
    assert remote["mem_total"] > 0 and "load1" in remote and "net_rx_bytes" in remote
    busy = [cpu for (h, _), (cpu, rss) in model.procs.items() if h == str(host) and cpu and rss > 0]
    assert busy and max(busy) > 20, model.procs
    assert "localhost" in model.hosts  # the launcher's own host (the scheduler's)
