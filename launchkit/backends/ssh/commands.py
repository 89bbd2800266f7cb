"""One-shot commands on many hosts over ssh, in parallel: probing (``hosts check``) and
ending jobs (``kill``). Partial failure is data: one ``HostResult`` per host."""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from launchkit.backends.ssh.connection import SshOptions, connect, on_each, run
from launchkit.core.spec import Host
from launchkit.errors import BackendError
from launchkit.hostside import procscan

PROBE = r"""
import json, os, platform, shutil, socket, subprocess, sys
info = {"hostname": socket.gethostname(), "cpus": os.cpu_count(), "python": platform.python_version()}
try:
    with open("/proc/meminfo") as f:
        info["mem_bytes"] = int(next(l for l in f if l.startswith("MemTotal")).split()[1]) * 1024
except Exception:
    info["mem_bytes"] = None
gpus = []
if shutil.which("nvidia-smi"):
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10).stdout
        gpus = [l.strip() for l in out.splitlines() if l.strip()]
    except Exception:
        pass
info["gpus"] = gpus
try:
    import launchkit
    info["launchkit"] = launchkit.__version__
except Exception:
    info["launchkit"] = None
print(json.dumps(info))
"""

SWEEP = r"""
import sys, types
src = sys.stdin.read()
m = types.ModuleType("procscan"); exec(compile(src, "<procscan>", "exec"), m.__dict__)
job = sys.argv[1] or None
n = m.sweep_job(job, float(sys.argv[2]))
if job:
    m.remove_shm(job)
print(n)
"""


@dataclass(frozen=True)
class HostResult:
    host: Host
    ok: bool
    error: str = ""
    latency_ms: float | None = None
    data: dict[str, Any] = field(default_factory=dict)


def on_hosts(hosts: Sequence[Host], opts: SshOptions, work: Any) -> list[HostResult]:
    """Run ``work(host, client) -> dict`` on every host in parallel (bounded), in host order."""

    def one(h: Host) -> HostResult:
        t0 = time.monotonic()
        try:
            client = connect(h, opts)
        except BackendError as exc:
            return HostResult(h, False, exc.message.removeprefix("ssh: "))
        try:
            latency = (time.monotonic() - t0) * 1000
            return HostResult(h, True, latency_ms=latency, data=work(h, client))
        except Exception as exc:
            return HostResult(h, False, f"{h}: {exc}")
        finally:
            client.close()

    return on_each(one, hosts)


def probe(hosts: Sequence[Host], opts: SshOptions) -> list[HostResult]:
    def work(h: Host, client: Any) -> dict[str, Any]:
        t0 = time.monotonic()
        code, out, err = run(client, ["true"])
        rtt = (time.monotonic() - t0) * 1000
        code, out, err = run(client, ["python3", "-c", PROBE])
        if code != 0:
            raise RuntimeError(
                f"python3 probe failed ({code}): {err.decode(errors='replace').strip()[-200:]}"
            )
        data: dict[str, Any] = json.loads(out)
        data["rtt_ms"] = rtt
        return data

    return on_hosts(hosts, opts, work)


def sweep(hosts: Sequence[Host], opts: SshOptions, job_id: str | None, grace: float) -> list[HostResult]:
    """End every process of ``job_id`` (of every job when None) on every host."""
    src = inspect.getsource(procscan).encode()

    def work(h: Host, client: Any) -> dict[str, Any]:
        code, out, err = run(
            client, ["python3", "-c", SWEEP, job_id or "", str(grace)], stdin=src, timeout=grace + 30
        )
        if code != 0:
            raise RuntimeError(f"sweep failed ({code}): {err.decode(errors='replace').strip()[-200:]}")
        return {"ended": int(out.strip() or 0)}

    return on_hosts(hosts, opts, work)
