"""The scheduler's address through a shared file, and the secret from a file (in-process)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from launchkit.hostside import rendezvous


def test_scheduler_publishes_and_the_others_read(tmp_path: Path) -> None:
    path = str(tmp_path / "scheduler")
    found: dict[str, str] = {}

    def worker() -> None:
        env = {"DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "", rendezvous.RENDEZVOUS_VAR: path}
        rendezvous.resolve(env)
        found.update(env)

    t = threading.Thread(target=worker)
    t.start()
    time.sleep(0.3)  # the worker waits for the file
    sched = {
        "DMLC_ROLE": "scheduler",
        "DMLC_PS_ROOT_URI": "",
        rendezvous.RENDEZVOUS_VAR: path,
        "SGE_O_HOST": "127.0.0.1",
    }
    rendezvous.resolve(sched)
    t.join(5)
    assert sched["DMLC_PS_ROOT_URI"] == "127.0.0.1" and int(sched["DMLC_PS_ROOT_PORT"]) > 0
    assert (found["DMLC_PS_ROOT_URI"], found["DMLC_PS_ROOT_PORT"]) == (
        sched["DMLC_PS_ROOT_URI"],
        sched["DMLC_PS_ROOT_PORT"],
    )


def test_wait_gives_up_with_a_clear_message(tmp_path: Path) -> None:
    with pytest.raises(TimeoutError, match="did not publish its address"):
        rendezvous.wait_for(str(tmp_path / "never"), 0.3)


def test_known_address_and_secret_file(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("s3cr3t\n")
    env = {
        "DMLC_PS_ROOT_URI": "10.0.0.1",
        rendezvous.RENDEZVOUS_VAR: str(tmp_path / "x"),
        rendezvous.SECRET_FILE_VAR: str(tmp_path / "secret"),
    }
    rendezvous.resolve(env)
    assert env["LAUNCHKIT_JOB_SECRET"] == "s3cr3t" and env["DMLC_PS_ROOT_URI"] == "10.0.0.1"
    assert rendezvous.parse_root("garbage") is None and rendezvous.parse_root("1.2.3.4 80\n") == (
        "1.2.3.4",
        80,
    )


def test_worker_0_publishes_its_address_and_ports_and_the_others_take_them(tmp_path) -> None:
    path = str(tmp_path / "worker0")
    base = {
        rendezvous.WORKER0_VAR: path,
        "DMLC_ROLE": "worker",
        "MASTER_ADDR": "",
        "MASTER_PORT": "0",
        "DMLC_PS_ROOT_URI": "",
        "DMLC_PS_ROOT_PORT": "0",
        "LAUNCHKIT_ROOT_SERVER": "worker 0",
        "DMLC_INTERFACE": "lo",
    }
    zero = {**base, "LAUNCHKIT_ROLE_RANK": "0"}
    rendezvous.resolve(zero)
    assert zero["MASTER_ADDR"] == zero["DMLC_PS_ROOT_URI"] == "127.0.0.1"
    assert zero["MASTER_PORT"] != zero["DMLC_PS_ROOT_PORT"] and int(zero["MASTER_PORT"]) > 0
    one = {**base, "LAUNCHKIT_ROLE_RANK": "1"}
    rendezvous.resolve(one)
    assert {k: one[k] for k in zero if k.startswith(("MASTER", "DMLC_PS"))} == {
        k: zero[k] for k in zero if k.startswith(("MASTER", "DMLC_PS"))
    }
    # with a scheduler process, the root stays the scheduler's: only torch's variables come from worker 0
    other = {**base, "LAUNCHKIT_ROLE_RANK": "1", "LAUNCHKIT_ROOT_SERVER": "", "DMLC_PS_ROOT_URI": "10.0.0.9"}
    rendezvous.resolve(other)
    assert other["DMLC_PS_ROOT_URI"] == "10.0.0.9" and other["MASTER_PORT"] == zero["MASTER_PORT"]


def test_a_worker_whose_worker_0_never_publishes_gives_up_naming_it(tmp_path) -> None:
    env = {
        rendezvous.WORKER0_VAR: str(tmp_path / "worker0"),
        "DMLC_ROLE": "worker",
        "LAUNCHKIT_ROLE_RANK": "1",
        "PS_START_TIMEOUT": "0.3",
        "LAUNCHKIT_ROOT_SERVER": "worker 0",
    }
    with pytest.raises(TimeoutError, match="worker 0 did not publish its address"):
        rendezvous.resolve(env)


def test_with_a_scheduler_a_worker_goes_on_without_torchs_variables_when_worker_0_never_publishes(
    tmp_path, monkeypatch, capsys
) -> None:
    """A job with servers does not need worker 0's address (its scheduler is elsewhere): a directory
    the nodes do not share costs a bounded wait and a line, not the job."""
    monkeypatch.setattr(rendezvous, "OPTIONAL_WAIT", 0.3)
    env = {
        rendezvous.WORKER0_VAR: str(tmp_path / "worker0"),
        "DMLC_ROLE": "worker",
        "LAUNCHKIT_ROLE_RANK": "1",
        "MASTER_ADDR": "",
        "MASTER_PORT": "0",
        "DMLC_PS_ROOT_URI": "10.0.0.9",
        "PS_START_TIMEOUT": "600",
    }
    t0 = time.monotonic()
    rendezvous.resolve(env)
    assert time.monotonic() - t0 < 5
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["DMLC_PS_ROOT_URI"]) == ("", "0", "10.0.0.9")
    assert "worker 0 did not publish its address" in capsys.readouterr().err


def test_worker_0_publishes_a_pinned_master_port(tmp_path) -> None:
    """--master-port on an engine: the plan gives MASTER_PORT, MASTER_ADDR is worker 0's node's."""
    path = str(tmp_path / "worker0")
    base = {
        rendezvous.WORKER0_VAR: path,
        "DMLC_ROLE": "worker",
        "MASTER_ADDR": "",
        "MASTER_PORT": "29517",
        "DMLC_PS_ROOT_URI": "",
        "DMLC_PS_ROOT_PORT": "0",
        "LAUNCHKIT_ROOT_SERVER": "worker 0",
        "DMLC_INTERFACE": "lo",
    }
    zero = {**base, "LAUNCHKIT_ROLE_RANK": "0"}
    rendezvous.resolve(zero)
    one = {**base, "LAUNCHKIT_ROLE_RANK": "1"}
    rendezvous.resolve(one)
    assert zero["MASTER_PORT"] == one["MASTER_PORT"] == "29517" and one["MASTER_ADDR"] == "127.0.0.1"
    assert zero["DMLC_PS_ROOT_PORT"] != "29517" and int(zero["DMLC_PS_ROOT_PORT"]) > 0
