"""launchkit.hostdiscovery: an elastic job's hosts read again while it runs: the hostfile when its
time changes, the discovery script every time (a failure is a DiscoveryError naming it), on a
thread of their own (``HostPoller``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from launchkit.core.spec import Host
from launchkit.errors import UsageError
from launchkit.hostdiscovery import DiscoveryError, HostPoller, HostSource, first_hosts, run_script
from tests.launchkit.procs import wait_until


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "discover.sh"
    path.write_text(f"#!/bin/sh\n{body}\n")
    os.chmod(path, 0o755)
    return str(path)


def test_the_hostfile_is_read_again_when_it_changes(tmp_path: Path) -> None:
    hf = tmp_path / "hosts"
    hf.write_text("a slots=2\n")
    source = HostSource(str(hf), None)
    assert source.poll() is None  # unchanged since the launch read it
    hf.write_text("a slots=2\nb slots=1\n")
    os.utime(hf, (1, 1))  # a new time, whatever the clock's resolution
    assert [(h.name, h.slots) for h in source.poll() or ()] == [("a", 2), ("b", 1)]
    assert source.poll() is None
    hf.write_text("a slots=x\n")
    os.utime(hf, (2, 2))
    with pytest.raises(DiscoveryError, match="bad slots 'x'"):
        source.poll()


@pytest.mark.proc
def test_the_script_is_run_every_time_and_only_a_new_list_is_returned(tmp_path: Path) -> None:
    path = script(tmp_path, f"cat {tmp_path}/list")
    (tmp_path / "list").write_text("a:2\n")
    source = HostSource(None, path)
    assert source.poll() == (Host("a", slots=2, line=1),)
    assert source.poll() is None
    (tmp_path / "list").write_text("a:2\nb:1\n")
    assert [h.name for h in source.poll() or ()] == ["a", "b"]


@pytest.mark.proc
def test_a_failing_script_names_itself_and_its_last_line(tmp_path: Path) -> None:
    with pytest.raises(DiscoveryError, match="exited 4: no inventory"):
        run_script(script(tmp_path, "echo no inventory >&2; exit 4"))
    with pytest.raises(DiscoveryError, match=r"no answer within 0\.2 s"):
        run_script(script(tmp_path, "sleep 5"), timeout=0.2)
    with pytest.raises(UsageError, match="printed no host"):
        first_hosts(script(tmp_path, "true"))


@pytest.mark.proc
def test_the_poller_runs_the_script_on_its_own_thread_and_hands_over_what_came(tmp_path: Path) -> None:
    (tmp_path / "list").write_text("a:1\n")
    poller = HostPoller(HostSource(None, script(tmp_path, f"cat {tmp_path}/list || exit 9")), every=0.02)
    poller.start()
    try:
        got: list = []
        assert wait_until(lambda: got.extend(poller.take()) or got, 10)
        assert got[0] == ((Host("a", slots=1, line=1),), None)
        (tmp_path / "list").unlink()
        assert wait_until(lambda: any(err for _, err in poller.take()), 10)
    finally:
        poller.close()
    assert not poller._thread.is_alive()
