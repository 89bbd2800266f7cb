"""One-shot commands on many hosts over ssh: probing (``hosts check``) and ending jobs (``kill``,
and a restart's check that the last attempt left nothing: ``Reach``).

For a probe, hosts are reached in parallel (``connection``), at most MAX_PARALLEL at a time, and
the command runs on each such batch as one fabric ``ThreadingGroup``. Partial failure is data:
the group's ``GroupResult`` (succeeded and failed, per connection) becomes one ``HostResult`` per
host, in hostfile order. Commands are argv lists quoted with ``shlex``; nothing is read from this
machine's stdin.
"""

from __future__ import annotations

import inspect
import json
import shlex
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from launchkit.backends.ssh.options import SshOptions
from launchkit.core.hostfile import unique_hosts
from launchkit.core.spec import Host
from launchkit.errors import BackendError
from launchkit.hostside import procscan

PROBE = r"""
import json, os, platform, shutil, socket, subprocess, sys
info = {"hostname": socket.gethostname(), "cpus": os.cpu_count(), "python": platform.python_version()}
try:
    info["name_address"] = socket.gethostbyname(socket.gethostname())
except OSError:
    info["name_address"] = None
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

# procscan's source travels as the first argument, not on stdin: invoke forwards stdin one byte
# per 10 ms (docs/ssh.md, "fabric").
SWEEP = r"""
import sys, types
m = types.ModuleType("procscan"); exec(compile(sys.argv[1], "<procscan>", "exec"), m.__dict__)
ids = [j for j in sys.argv[2].split(",") if j]
n = m.sweep_job(ids[0] if len(ids) == 1 else ids, float(sys.argv[3]))
for job in ids:
    m.remove_shm(job)
print(n)
"""

# every job with a process on the host: job id -> the LAUNCHKIT_JOB_HOME they carry -> how many
# (``kill --all -H``, which decides here whose each is: launchkit.jobs.owner)
SCAN = r"""
import json, sys, types
m = types.ModuleType("procscan"); exec(compile(sys.argv[1], "<procscan>", "exec"), m.__dict__)
print(json.dumps({j: {h: len(p) for h, p in homes.items()} for j, homes in m.scan().items()}))
"""


@dataclass(frozen=True)
class HostResult:
    host: Host
    ok: bool
    error: str = ""
    latency_ms: float | None = None  # how long the connection took to open
    data: dict[str, Any] = field(default_factory=dict)


def on_hosts(
    hosts: Sequence[Host],
    opts: SshOptions,
    argv: list[str],
    read: Callable[[str], dict[str, Any]],
    *,
    timeout: float,
    what: str,
) -> list[HostResult]:
    """Run ``argv`` on every host; ``read(stdout)`` turns a zero exit's output into the host's data.
    A non-zero exit is that host's error (``what`` failed, with the end of its stderr). Hosts go
    MAX_PARALLEL at a time: a batch is reached, runs the command as one group, and is closed."""
    from launchkit.backends.ssh import connection as ssh

    config = ssh.fabric_config(opts)
    results: dict[Host, HostResult] = {}
    hosts_of: dict[Any, list[Host]] = {}  # entries naming one login (equal connections) run it once
    for h in hosts:
        try:
            hosts_of.setdefault(ssh.connection(h, opts, config), []).append(h)
        except BackendError as exc:
            results[h] = HostResult(h, False, exc.message.removeprefix("ssh: "))
    distinct = list(hosts_of)
    for start in range(0, len(distinct), ssh.MAX_PARALLEL):
        batch = {conn: hosts_of[conn] for conn in distinct[start : start + ssh.MAX_PARALLEL]}
        results.update(_run_batch(batch, opts, shlex.join(argv), read, timeout, what))
    return [results[h] for h in hosts]


def _run_batch(
    batch: dict[Any, list[Host]],
    opts: SshOptions,
    command: str,
    read: Callable[[str], dict[str, Any]],
    timeout: float,
    what: str,
) -> dict[Host, HostResult]:
    import fabric
    from fabric.exceptions import GroupException

    from launchkit.backends.ssh import connection as ssh

    results: dict[Host, HostResult] = {}
    reached: dict[Any, HostResult] = {}

    def reach(conn: Any) -> None:
        first = batch[conn][0]
        try:
            ms = ssh.open_connection(first, conn, opts)
            rtt = ssh.round_trip_ms(first, conn, opts)
        except BackendError as exc:
            error = exc.message.removeprefix("ssh: ")
            results.update(
                {h: HostResult(h, False, error.replace(str(first), str(h), 1)) for h in batch[conn]}
            )
            return
        reached[conn] = HostResult(first, True, latency_ms=ms, data={"rtt_ms": rtt})

    ssh.on_each(reach, list(batch))
    # The deadline is ours, not invoke's: invoke's timer closes the channel from its own thread and
    # the run can return before that thread finishes, unmarked as timed out, with the thread still
    # writing to a transport that is closed next. Ours closes the connections and is joined first.
    fired = threading.Event()

    def expire() -> None:
        fired.set()
        for conn in reached:
            ssh.close(conn)

    deadline = threading.Timer(timeout, expire)
    deadline.start()
    try:
        done = fabric.ThreadingGroup.from_connections(list(reached)).run(
            command, hide=True, warn=True, in_stream=False
        )
    except GroupException as exc:
        done = exc.result
    finally:
        deadline.cancel()
        deadline.join()
    expired = fired.is_set()
    late = f"{what} did not complete within {timeout:g} seconds"
    for conn, error in done.failed.items():
        for h in batch[conn]:
            results[h] = HostResult(
                h, False, f"{h}: {late}" if expired else ssh.describe(h, conn, opts, error)
            )
    for conn, res in done.succeeded.items():
        for h in batch[conn]:
            if res.exited == -1 and expired:  # no exit status: its connection was closed
                results[h] = HostResult(h, False, f"{h}: {late}")
                continue
            if res.exited != 0:
                error = f"{h}: {what} failed ({res.exited}): {res.stderr.strip()[-200:]}"
                results[h] = HostResult(h, False, error)
                continue
            try:
                data = {**reached[conn].data, **read(res.stdout)}
            except ValueError as exc:
                results[h] = HostResult(h, False, f"{h}: {what} said something unexpected: {exc}")
                continue
            results[h] = HostResult(h, True, latency_ms=reached[conn].latency_ms, data=data)
    for conn in batch:
        ssh.close(conn)
    return results


#: a sweep of a job on a host: a shell's look first (one grep over every environ), and python only
#: when a process of it is left there: after its launcher ended the job, its watchdog has ended
#: everything, and 128 hosts' python3 starts (about 40 ms of CPU each) were most of ``kill``'s 4 s
#: sweep. $1 the job, $2 SWEEP, $3 procscan's source, $4 the grace period. (Several jobs, comma
#: separated, go to python at once: ``kill --all -H`` sweeps only where its scan found them.)
SWEEP_JOB = (
    'case "$1" in *,*) ;; *) grep -qzxF "LAUNCHKIT_JOB_ID=$1" /proc/[0-9]*/environ 2>/dev/null || '
    '{ rm -f /dev/shm/launchkit-"$1"-*; echo 0; exit 0; } ;; esac; '
    'exec python3 -S -c "$2" "$3" "$1" "$4"'
)
#: the scan of a host (``SCAN``), python only when some process carries a job id. $1 SCAN, $2 procscan's source.
SCAN_JOBS = 'grep -qz "^LAUNCHKIT_JOB_ID=" /proc/[0-9]*/environ 2>/dev/null || { echo "{}"; exit 0; }; exec python3 -S -c "$1" "$2"'


class Reach:
    """Connections to some hosts (one per login: ``unique_hosts``), opened in the background from
    the start (``kill``: while it sweeps this machine), then one sweep of a job, or of every job,
    on each, all at once over those connections, within a bound. What ``kill JOB`` (the hosts
    that ran the job), ``kill --all -H`` (the given hosts) and a restart (before the next attempt)
    sweep hosts with."""

    def __init__(self, hosts: Sequence[Host], opts: SshOptions) -> None:
        self.hosts = unique_hosts(hosts)
        self.opts = opts
        self.conns: dict[Host, Any] = {}
        self.errors: dict[Host, str] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._connect, daemon=True, name="reach")
        self._thread.start()

    def _connect(self) -> None:
        from launchkit.backends.ssh import connection as ssh

        try:
            config = ssh.fabric_config(self.opts)
        except BackendError as exc:
            self.errors = {h: f"{h}: {exc.message.removeprefix('ssh: ')}" for h in self.hosts}
            return

        def one(h: Host) -> None:
            try:
                conn = ssh.connect(h, self.opts, config)
            except BackendError as exc:
                self.errors[h] = exc.message.removeprefix("ssh: ")
                return
            with self._lock:
                if not self._closed:
                    self.conns[h] = conn
                    return
            ssh.close(conn)  # opened after the sweep gave up on it

        ssh.on_each(one, self.hosts)

    def sweep(self, job_id: str, grace: float, timeout: float) -> list[HostResult]:
        """End what is left of ``job_id`` on every host (``ended``: how many); a host that takes
        longer than ``timeout`` seconds in all, connecting included, is that host's error."""
        return self.sweep_each({h: [job_id] for h in self.hosts}, grace, timeout)

    def sweep_each(self, ids_of: dict[Host, list[str]], grace: float, timeout: float) -> list[HostResult]:
        """End what is left of the jobs ``ids_of`` names for each host (a host it names none for:
        ``ended`` 0, not contacted), then close every connection."""
        source = inspect.getsource(procscan)

        def argv(h: Host) -> list[str] | None:
            ids = ids_of.get(h) or []
            return ["sh", "-c", SWEEP_JOB, "sweep", ",".join(ids), SWEEP, source, str(grace)] if ids else None

        def read(out: str) -> dict[str, Any]:
            return {"ended": int(out.strip() or 0)}

        try:
            return self._each(argv, read, "sweep", timeout, {"ended": 0})
        finally:
            self.close()

    def scan(self, timeout: float) -> list[HostResult]:
        """Every job with a process on each host (``jobs``: job id -> ``LAUNCHKIT_JOB_HOME`` ->
        how many); the connections stay open (a ``sweep_each`` follows)."""

        def read(out: str) -> dict[str, Any]:
            found = json.loads(out or "{}")
            if not isinstance(found, dict) or not all(isinstance(v, dict) for v in found.values()):
                raise ValueError(f"not job -> home -> count: {out.strip()[:200]!r}")
            return {"jobs": found}

        argv = ["sh", "-c", SCAN_JOBS, "scan", SCAN, inspect.getsource(procscan)]
        return self._each(lambda h: argv, read, "scan", timeout, {"jobs": {}})

    def _each(
        self,
        argv_of: Callable[[Host], list[str] | None],
        read: Callable[[str], dict[str, Any]],
        what: str,
        timeout: float,
        skipped: dict[str, Any],
    ) -> list[HostResult]:
        """Run ``argv_of(host)`` on every host at once (``skipped`` is the data of a host it gives
        None for); ``read`` turns its output into the host's data."""
        from launchkit.backends.ssh import connection as ssh

        deadline = time.monotonic() + timeout
        self._thread.join(timeout)
        late = f"{what} did not complete within {timeout:g} seconds"

        def one(h: Host) -> HostResult:
            argv = argv_of(h)
            if argv is None:
                return HostResult(h, True, data=dict(skipped))
            with self._lock:
                conn = self.conns.get(h)
            if conn is None:
                return HostResult(h, False, self.errors.get(h, f"{h}: {late}"))
            try:
                chan = conn.transport.open_session(timeout=max(0.1, deadline - time.monotonic()))
                chan.settimeout(max(0.1, deadline - time.monotonic()))
                chan.exec_command(shlex.join(argv))
                out = chan.makefile("rb").read().decode(errors="replace")
                err = chan.makefile_stderr("rb").read().decode(errors="replace")
                rc = chan.recv_exit_status()
            except TimeoutError:
                return HostResult(h, False, f"{h}: {late}")
            except Exception as exc:
                return HostResult(h, False, ssh.describe(h, conn, self.opts, exc))
            if rc != 0:
                return HostResult(h, False, f"{h}: {what} failed ({rc}): {err.strip()[-200:]}")
            try:
                return HostResult(h, True, data=read(out))
            except ValueError:
                return HostResult(h, False, f"{h}: {what} said something unexpected: {out.strip()[:200]!r}")

        return ssh.on_each(one, self.hosts)

    def close(self) -> None:
        """Close every connection; one still being opened is closed as it opens (never waited for)."""
        from launchkit.backends.ssh import connection as ssh

        with self._lock:
            self._closed = True
            conns, self.conns = list(self.conns.values()), {}
        for conn in conns:
            ssh.close(conn)


def probe(hosts: Sequence[Host], opts: SshOptions) -> list[HostResult]:
    """Each host's name, CPUs, memory, GPUs and Python, with the connect time and round trip."""
    return on_hosts(hosts, opts, ["python3", "-c", PROBE], json.loads, timeout=30.0, what="python3 probe")
