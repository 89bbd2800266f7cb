"""What a watchdog's start costs each host: the bootstrap compiles a shipped module when it is
first imported, and the start imports nothing the job's end alone needs (issue 28: at 128 hosts
their imports and compiles were about a second of the 2 cores' time)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from launchkit.backends.ssh.agent import bootstrap_payload, remote_command


def imported_by_a_watchdog(to_its_end: bool) -> set[str]:
    """The modules a watchdog imports from its start to ``ready`` (killed there), or to its
    ``bye`` after a ``shutdown``."""
    p = subprocess.Popen(
        ["sh", "-c", remote_command(sys.executable)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"},
        start_new_session=True,
    )
    assert p.stdin is not None and p.stdout is not None
    try:
        p.stdin.write(bootstrap_payload())
        p.stdin.write(b'{"op":"hello","job":"wd-start","hb_interval":60,"hb_timeout":60,"grace":1}\n')
        p.stdin.flush()
        assert json.loads(p.stdout.readline())["ev"] == "ready"
        if to_its_end:
            p.stdin.write(b'{"op":"shutdown"}\n')
            p.stdin.flush()
            assert json.loads(p.stdout.readline())["ev"] == "bye"
    finally:
        os.killpg(p.pid, signal.SIGKILL)  # (sh and python3): only what they imported so far
        _, err = p.communicate(timeout=10)
    return {
        line.rsplit("|", 1)[1].strip()
        for line in err.decode().splitlines()
        if line.startswith("import time:")
    }


def test_the_start_leaves_the_sweep_and_the_interface_lookup_for_later() -> None:
    imported = imported_by_a_watchdog(to_its_end=False)
    assert {"launchkit.hostside.watchdog", "launchkit.hostside.childio"} <= imported
    assert not imported & {
        "launchkit.hostside.procscan",
        "pathlib",
        "launchkit.hostside.netif",
        "dmlc_env",
        "ipaddress",
        # nor what the standard library's conveniences would bring (about 11 ms a host)
        "dataclasses",
        "typing",
        "shutil",
        "socket",
    }


def test_the_end_sweeps_without_pathlib() -> None:
    """Every host's teardown runs at once at a job's end: its sweep imports no ``pathlib``."""
    imported = imported_by_a_watchdog(to_its_end=True)
    assert "launchkit.hostside.procscan" in imported
    assert not imported & {"pathlib", "shutil", "dataclasses", "typing"}
