"""--launcher yarn through the real CLI, against the stand-in ResourceManager (tests/cluster/
yarn_standin.py: it validates every spec and really runs each container's launch command here).
No ResourceManager can be installed on these machines: nothing here ran against a real YARN."""

from __future__ import annotations

import functools
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from launchkit.backends.yarnrest import RmClient
from launchkit.backends.yarnspec import YarnOptions, service_name, service_spec
from launchkit.core.spec import LOCALHOST, LaunchSpec
from tests.cluster.enginejobs import check_contract
from tests.launchkit.plans import make_plan
from tests.launchkit.procs import LAUNCHKIT, pids_with_job, record, wait_for_job, wait_until

from .yarn_standin import TREE, StandinRM

PROG = str(Path(__file__).with_name("yarnprog.py"))
HOSTILE = "a b $HOME '\" `x` ${USER} {{y}} <LOG_DIR>\nsecond line\\"

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def rm(tmp_path: Path):
    server = StandinRM(tmp_path / "rm").start()
    yield server
    server.stop()
    assert not server.errors, server.errors


@functools.cache
def cli_has(flag: str) -> bool:
    out = subprocess.run([*LAUNCHKIT, "launch", "--help"], capture_output=True, text=True, timeout=30).stdout
    return flag in out


def yarn_args(rm: StandinRM) -> list[str]:
    """``--launcher yarn --yarn-rm URL``; until the CLI has --yarn-rm, $YARN_RM_URL (set by
    ``env_for``) carries the address to the backend's default."""
    return ["--launcher", "yarn", *(["--yarn-rm", rm.url] if cli_has("--yarn-rm") else [])]


def env_for(rm: StandinRM, home: Path) -> dict[str, str]:
    return {**os.environ, "LAUNCHKIT_HOME": str(home), "YARN_RM_URL": rm.url}


def launch(
    rm: StandinRM, home: Path, cwd: Path, *args: str, timeout: float = 25
) -> subprocess.CompletedProcess[str]:
    argv = [*LAUNCHKIT, "launch", *yarn_args(rm), *args]
    return subprocess.run(
        argv,
        cwd=cwd,
        env=env_for(rm, home),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def start(rm: StandinRM, home: Path, cwd: Path, *args: str) -> subprocess.Popen[str]:
    argv = [*LAUNCHKIT, "launch", *yarn_args(rm), *args]
    return subprocess.Popen(
        argv,
        cwd=cwd,
        env=env_for(rm, home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


def calls(rm: StandinRM) -> list[str]:
    """The requests that change something, in order: POST, PUT state, DELETE."""
    out = []
    for method, _path, body in rm.requests():
        if method == "PUT":
            out.append(f"PUT {body.get('state')}")
        elif method != "GET":
            out.append(method)
    return out


def running_containers(rm: StandinRM, outdir: Path, count: int) -> bool:
    return len(list(outdir.glob("*.pid"))) == count and not rm.errors


def test_job_runs_with_roles_ranks_and_environment(
    rm: StandinRM, tmp_path: Path, launchkit_home: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    res = launch(
        rm,
        launchkit_home,
        tmp_path,
        "-n",
        "2",
        "-s",
        "2",
        "--env",
        f"X_HOSTILE:{HOSTILE}",
        "--log-dir",
        str(tmp_path / "logs"),
        sys.executable,
        PROG,
        "env",
        str(out),
        HOSTILE,
        "it's",
    )
    assert res.returncode == 0, res.stderr[-3000:]
    reports = {tuple(p.stem.rsplit("-", 1)): json.loads(p.read_text()) for p in out.glob("*.json")}
    envs = {(role, int(rank)): r["env"] for (role, rank), r in reports.items()}
    check_contract(envs, 2, 2, cluster="yarn")
    svc = rm.service()
    for (_role, rank), env in envs.items():
        assert env["X_HOSTILE"] == HOSTILE
        assert env["DMLC_PS_ROOT_URI"] == f"scheduler-0.{svc.name}.{svc.user}.standin.test"
        assert env["DMLC_PS_ROOT_PORT"] == "9091"
        assert env["COMPONENT_ID"] == str(rank) and env["CONTAINER_ID"].startswith("container_")
        assert env["DMLC_NODE_HOST"]  # found by the shim on the node
    assert all(r["argv"] == [HOSTILE, "it's"] for r in reports.values())
    # the containers (and so each node's shim) run the tree under test, not the installed launchkit
    assert {r["launchkit"] for r in reports.values()} == {str(TREE / "launchkit" / "__init__.py")}
    assert len({r["cwd"] for r in reports.values()}) == 5  # a working directory per container
    job = envs[("worker", 0)]["LAUNCHKIT_JOB_ID"]
    assert svc.name == service_name(job)
    assert record(launchkit_home, job)["state"] == "succeeded"
    assert calls(rm)[:2] == ["POST", "DELETE"]  # a finished service is deleted
    assert "yarn logs -applicationId " + svc.app_id in res.stderr
    assert (
        "output of this process is not streamed by YARN"
        in (tmp_path / "logs" / "worker-1.stderr").read_text()
    )
    assert all(c.state == "SUCCEEDED" for c in svc.all_containers())


def test_failing_worker_is_the_root_cause_and_the_service_is_stopped(
    rm: StandinRM, tmp_path: Path, launchkit_home: Path
) -> None:
    res = launch(
        rm,
        launchkit_home,
        tmp_path,
        "-n",
        "2",
        "-s",
        "2",
        "--grace-period",
        "2",
        sys.executable,
        PROG,
        "fail",
        "worker",
        "1",
        "3",
    )
    assert res.returncode == 1, res.stderr[-3000:]  # the Service API has no exit status: FAILED is 1
    assert f"worker 1 on {rm.host} exited with code 1" in res.stderr
    assert "yarn logs -applicationId" in res.stderr  # the failure report points at the output
    assert calls(rm)[:3] == ["POST", "PUT STOPPED", "DELETE"]
    svc = rm.service()
    states = {c.instance: c.state for c in svc.all_containers()}
    assert states.pop("worker-1") == "FAILED" and set(states.values()) == {"STOPPED"}
    job = wait_for_job(launchkit_home)
    assert record(launchkit_home, job)["state"] == "failed"
    assert wait_until(lambda: not pids_with_job(job), 5)


@pytest.mark.parametrize("how", ["kill", "ctrl-c", "launcher-sigkill"])
def test_kill_ctrl_c_and_the_launchers_death_stop_the_service(
    rm: StandinRM, tmp_path: Path, launchkit_home: Path, how: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc = start(rm, launchkit_home, tmp_path, "-n", "2", "-s", "1", sys.executable, PROG, "wait", str(out))
    try:
        assert wait_until(lambda: running_containers(rm, out, 4), 15), calls(rm)
        job = wait_for_job(launchkit_home)
        if how == "kill":
            killer = subprocess.Popen(
                [*LAUNCHKIT, "kill", job],
                env=env_for(rm, launchkit_home),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            proc.wait(20)  # reaped here, so that `launchkit kill` sees the launcher gone at once
            _, kill_err = killer.communicate(timeout=20)
            assert killer.returncode == 0, kill_err
        elif how == "ctrl-c":
            os.kill(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGKILL)  # the reaper runs python -m launchkit.backends.yarnrest stop
        proc.wait(20)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = proc.stderr.read() if proc.stderr else ""
    expected = {"kill": 143, "ctrl-c": 130, "launcher-sigkill": -signal.SIGKILL}[how]
    assert proc.returncode == expected, stderr[-3000:]
    # the stand-in logs a request before it acts on it: wait for the act
    assert wait_until(lambda: rm.service().destroyed, 10), calls(rm)
    assert calls(rm)[:3] == ["POST", "PUT STOPPED", "DELETE"]
    svc = rm.service()
    assert all(c.killed and c.state == "STOPPED" for c in svc.all_containers())
    assert wait_until(lambda: not pids_with_job(job), 5), pids_with_job(job)
    if how != "launcher-sigkill":
        assert record(launchkit_home, job)["state"] in ("killed", "interrupted")


def test_time_limit_ends_the_job_and_sets_the_services_lifetime(
    rm: StandinRM, tmp_path: Path, launchkit_home: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    res = launch(
        rm,
        launchkit_home,
        tmp_path,
        "-n",
        "1",
        "-s",
        "1",
        "--time-limit",
        "1.5",
        "--grace-period",
        "1",
        sys.executable,
        PROG,
        "wait",
        str(out),
    )
    assert res.returncode == 124, res.stderr[-3000:]
    (post,) = [body for method, _p, body in rm.requests("POST")]
    assert post["lifetime"] == 2 + 1 + 60  # ceil(time limit + grace) + a minute: YARN's backstop
    assert calls(rm)[:3] == ["POST", "PUT STOPPED", "DELETE"]


def test_shipped_files_reach_every_container(rm: StandinRM, tmp_path: Path) -> None:
    """--yarn-file entries as configuration.files: a STATIC file linked, an ARCHIVE unpacked."""
    (rm.hdfs_root / "user/me").mkdir(parents=True)
    (rm.hdfs_root / "user/me/notes.txt").write_text("shipped by hdfs")
    with tarfile.open(rm.hdfs_root / "user/me/pkg.tar.gz", "w:gz") as tar:
        data = b"print('hi')\n"
        info = tarfile.TarInfo("mod.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    out = tmp_path / "out"
    out.mkdir()
    spec = LaunchSpec(
        num_workers=1, num_servers=1, command=(sys.executable, PROG, "env", str(out)), backend="yarn"
    )
    plan = make_plan(
        spec, job_id="files-1", secret="s", root_uri="", root_port=0, node_host_of={LOCALHOST: ""}
    )
    opts = YarnOptions(files=("hdfs:///user/me/notes.txt", "hdfs://nn:8020/user/me/pkg.tar.gz#pkg"))
    client = RmClient(rm.url, "me")
    client.create(service_spec(plan, opts))
    assert wait_until(lambda: len(list(out.glob("*.json"))) == 3, 15), rm.errors
    for report in out.glob("*.json"):
        data = json.loads(report.read_text())
        assert {"notes.txt", "pkg"} <= set(data["files"]) and data["shipped"][
            "notes.txt"
        ] == "shipped by hdfs"
        assert (Path(data["cwd"]) / "pkg" / "mod.py").exists()
    client.destroy(service_name("files-1"))


def test_a_refused_service_fails_the_launch_with_the_rms_reason(tmp_path: Path, launchkit_home: Path) -> None:
    small = StandinRM(tmp_path / "small-rm", max_memory_mb=512).start()  # a cluster with 512 MB containers
    try:
        res = launch(small, launchkit_home, tmp_path, "-n", "1", "-s", "1", sys.executable, PROG, "env", ".")
        assert res.returncode == 126, res.stderr[-3000:]  # as a process that cannot be started
        assert "refused the service (HTTP 500)" in res.stderr
        assert "larger than configured max container memory size (512)" in res.stderr
        assert calls(small) == ["POST"]
    finally:
        small.stop()
    off = StandinRM(tmp_path / "off-rm", api_enabled=False).start()  # yarn.webapp.api-service.enable=false
    try:
        res = launch(off, launchkit_home, tmp_path, "-n", "1", "-s", "1", sys.executable, PROG, "env", ".")
        assert res.returncode == 1 and "yarn.webapp.api-service.enable=true" in res.stderr, res.stderr
        assert calls(off) == []  # nothing submitted
    finally:
        off.stop()
    argv = [*LAUNCHKIT, "launch", "--launcher", "yarn", "-n", "1", sys.executable, PROG, "env", "."]
    env = {**os.environ, "LAUNCHKIT_HOME": str(launchkit_home), "YARN_RM_URL": "http://127.0.0.1:9"}
    res = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=20)
    assert res.returncode == 1 and "cannot reach the ResourceManager at http://127.0.0.1:9" in res.stderr


def test_a_standby_rms_redirect_is_followed_with_method_and_body(rm: StandinRM) -> None:
    class Standby(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _redirect(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(307)
            self.send_header("Location", rm.url + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = do_PUT = do_DELETE = _redirect

    standby = HTTPServer(("127.0.0.1", 0), Standby)
    threading.Thread(target=standby.serve_forever, daemon=True).start()
    try:
        client = RmClient(f"http://127.0.0.1:{standby.server_address[1]}", "me")
        spec = {
            "name": "lk-redirect",
            "version": "1",
            "components": [
                {
                    "name": "c",
                    "number_of_containers": 1,
                    "launch_command": "true",
                    "resource": {"cpus": 1, "memory": "64"},
                    "restart_policy": "NEVER",
                }
            ],
        }
        assert client.create(spec)["state"] == "ACCEPTED"
        assert rm.requests("POST")[0][2] == spec
        assert wait_until(lambda: (client.get("lk-redirect") or {}).get("state") == "STOPPED", 10)
        client.destroy("lk-redirect")
        assert client.get("lk-redirect") is None
    finally:
        standby.shutdown()
        standby.server_close()
