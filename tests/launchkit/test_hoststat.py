"""A host's figures and its job processes' usage (hostside.hoststat), as the launcher's sampler
and the ssh hosts' watchdogs take them; the watchdog's heartbeats carry them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launchkit.backends.ssh.agent import usage_of
from launchkit.hostside import hoststat
from tests.launchkit.test_remote import Dog

NET_DEV = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: 1000      10    0    0    0     0          0         0     1000      10    0    0    0     0       0          0
  eth0: 2000      20    0    0    0     0          0         0     3000      30    0    0    0     0       0          0
  eth1:   50       1    0    0    0     0          0         0       70       1    0    0    0     0       0          0
"""


def test_parsers_read_proc_text() -> None:
    assert hoststat.parse_loadavg("0.52 0.40 0.31 2/345 6789\n") == {"load1": 0.52}
    mem = hoststat.parse_meminfo("MemTotal:  1000 kB\nMemFree:  100 kB\nMemAvailable:  400 kB\n")
    assert mem == {"mem_total": 1000 * 1024, "mem_used": 600 * 1024}
    assert hoststat.parse_net_dev(NET_DEV) == {"net_rx_bytes": 2050, "net_tx_bytes": 3070}  # not lo
    gpus = hoststat.parse_gpus("50, 1000, 8000\n100, 3000, 8000\n")
    assert gpus == {"gpu_util": 75.0, "gpu_mem_used": 4000 * 2**20, "gpu_mem_total": 16000 * 2**20}
    assert hoststat.parse_gpus("[N/A], 1, 2\n") == {}


def test_a_stat_line_with_spaces_and_parentheses_in_the_name() -> None:
    tick, page = hoststat.TICK, hoststat.PAGE
    fields = ["S", "1", "77", "77"] + ["0"] * 7 + [str(3 * tick), str(tick)] + ["0"] * 6 + ["555", "0", "9"]
    st = hoststat.parse_stat(88, b"88 (a (b) c) " + " ".join(fields).encode())
    assert st == hoststat.ProcStat(88, 77, 4.0, 9 * page, 555)
    assert hoststat.parse_stat(88, b"88 (x) S 1") is None


def test_this_host_has_figures() -> None:
    figures = hoststat.host_figures()
    assert figures["mem_total"] > figures["mem_used"] > 0
    assert figures["load1"] >= 0 and "net_rx_bytes" in figures


def test_cpu_percent_and_memory_of_a_busy_process_group() -> None:
    busy = subprocess.Popen(
        [sys.executable, "-c", "x = bytearray(50 << 20)\nprint('ready', flush=True)\nwhile True: pass"],
        start_new_session=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert busy.stdout is not None and busy.stdout.readline() == "ready\n"  # its memory is taken
        sampler = hoststat.Sampler(hoststat.Gpus(command=None))
        _, first = sampler.sample([busy.pid])
        assert first[busy.pid][0] is None  # no earlier sample to measure CPU against
        time.sleep(1.0)
        _, procs = sampler.sample([busy.pid])
        cpu, rss = procs[busy.pid]
        assert cpu is not None and 10 < cpu < 150  # one core at most (10: a busy 2-core machine)
        assert rss > 50 << 20
        _, gone = sampler.sample([os.getpid() + 10**7])
        assert gone == {}
    finally:
        busy.kill()
        busy.wait()


def fake_smi(tmp_path: Path, body: str) -> str:
    path = tmp_path / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


@pytest.mark.proc  # its process starts in launchkit's code (tests/tiers.py)
def test_nvidia_smi_is_asked_at_most_every_few_seconds(tmp_path: Path) -> None:
    count = tmp_path / "count"
    gpus = hoststat.Gpus(fake_smi(tmp_path, f"echo x >> {count}\necho '10, 100, 1000'\n"))
    assert gpus.sample() == {"gpu_util": 10.0, "gpu_mem_used": 100 * 2**20, "gpu_mem_total": 1000 * 2**20}
    assert gpus.sample()["gpu_util"] == 10.0
    assert count.read_text().count("x") == 1


@pytest.mark.proc  # its process starts in launchkit's code (tests/tiers.py)
def test_a_hung_nvidia_smi_is_given_up(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(hoststat, "GPU_TIMEOUT", 0.3)
    gpus = hoststat.Gpus(fake_smi(tmp_path, "exec sleep 30\n"))
    t = time.monotonic()
    assert gpus.sample() == {}
    assert time.monotonic() - t < 2


def test_heartbeats_carry_the_host_and_its_job_processes() -> None:
    dog = Dog("wd-hoststat-1")
    try:
        dog.until("ready")
        dog.send(
            {
                "op": "spawns",
                "procs": [{"id": 1, "argv": [sys.executable, "-c", "while True: pass"], "env": {}}],
            }
        )
        pid = dog.until("started", id=1)["pid"]
        deadline = time.monotonic() + 10
        while True:
            figures, procs = usage_of(dog.until("hb"))
            dog.events.clear()
            if procs.get(pid, (None, 0))[0] is not None:
                break
            assert time.monotonic() < deadline, "no CPU figure for the process"
        assert figures["mem_total"] > 0 and "load1" in figures and "net_tx_bytes" in figures
        cpu, rss = procs[pid]
        assert cpu is not None and cpu > 20 and rss > 0
    finally:
        dog.send({"op": "shutdown"})
        dog.until("bye")
        dog.p.wait(10)


def test_usage_from_a_heartbeat_is_checked() -> None:
    hb = {
        "ev": "hb",
        "host": {"load1": 1.5, "mem_used": "lots", "x": True, "big": 1e309, 3: 4},
        "procs": [[10, 55.5, 1024], [11, None, 2048], [12, "a", 1], ["13", 1, 1], [14, 1], [-1, 1, 1], "x"],
    }
    assert usage_of(hb) == ({"load1": 1.5}, {10: (55.5, 1024), 11: (None, 2048), 12: (None, 1)})
    assert usage_of({"ev": "hb", "host": [], "procs": {}}) == ({}, {})
