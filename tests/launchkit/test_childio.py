"""The watchdog's processes' output and ends, in one thread (``launchkit/hostside/childio.py``),
in-process: the watchdog writes to an object here instead of its ssh channel."""

from __future__ import annotations

import json
import signal
import threading
import time
from typing import Any

import pytest

from launchkit.hostside import watchdog


class Channel:
    """What the watchdog writes, as the launcher reads it: messages, and the bytes after ``out``."""

    def __init__(self) -> None:
        self.data = b""
        self.changed = threading.Condition()

    def write(self, data: bytes) -> None:
        with self.changed:
            self.data += data
            self.changed.notify_all()

    def flush(self) -> None:
        pass

    def messages(self) -> list[dict[str, Any]]:
        msgs, rest = [], self.data
        while rest:
            line, rest = rest.split(b"\n", 1)
            msg = json.loads(line)
            if msg.get("ev") == "out":
                msg["data"], rest = rest[: msg["n"]], rest[msg["n"] :]
            msgs.append(msg)
        return msgs

    def until(self, ok: Any, timeout: float = 10.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not ok(msgs := self.messages()):
                left = deadline - time.monotonic()
                assert left > 0, f"not within {timeout}s: {msgs[-6:]}"
                self.changed.wait(left)
        return msgs

    def output(self, ident: int) -> bytes:
        return b"".join(m["data"] for m in self.messages() if m.get("ev") == "out" and m["id"] == ident)


def _count(ev: str, ident: int | None = None) -> Any:
    return lambda msgs: sum(m.get("ev") == ev and (ident is None or m.get("id") == ident) for m in msgs)


@pytest.mark.proc  # its process starts in launchkit's code (tests/tiers.py)
def test_a_hosts_processes_need_no_thread_each() -> None:
    """8 processes, their output and their ends: one thread more in the watchdog, not 24."""
    chan = Channel()
    dog = watchdog.Watchdog(chan)  # type: ignore[arg-type]
    dog.hello({"job": "cio-1", "hb_interval": 60, "window": 1 << 20})
    before = threading.active_count()
    try:
        for i in range(8):
            argv = ["sh", "-c", 'echo "up $0"; exec sleep 30', str(i)]
            dog.spawns({"procs": [{"id": i, "argv": argv, "env": {"LAUNCHKIT_JOB_ID": "cio-1"}, "cwd": "/"}]})
        chan.until(lambda msgs: _count("out")(msgs) == 8)
        assert threading.active_count() - before <= 1
        assert [chan.output(i) for i in range(8)] == [f"up {i}\n".encode() for i in range(8)]
        for i in range(8):
            dog.signal(i, signal.SIGTERM)
        msgs = chan.until(lambda msgs: _count("exit")(msgs) == 8 and _count("eof")(msgs) == 16)
        assert sorted(m["id"] for m in msgs if m.get("ev") == "exit") == list(range(8))
        assert {m["rc"] for m in msgs if m.get("ev") == "exit"} == {-signal.SIGTERM}
    finally:
        dog.stopping.set()
        dog.teardown()


@pytest.mark.proc  # its process starts in launchkit's code (tests/tiers.py)
def test_a_stream_waits_for_its_acknowledgements_and_is_read_to_its_end_when_the_job_ends() -> None:
    chan = Channel()
    dog = watchdog.Watchdog(chan)  # type: ignore[arg-type]
    dog.hello({"job": "cio-2", "hb_interval": 60, "window": 4})
    try:
        code = "printf aaaa; sleep 0.2; printf bbbb; sleep 0.2; printf cccc"
        dog.spawns(
            {
                "procs": [
                    {"id": 1, "argv": ["sh", "-c", code], "env": {"LAUNCHKIT_JOB_ID": "cio-2"}, "cwd": "/"}
                ]
            }
        )
        chan.until(_count("exit", 1))  # its end is seen while its stream waits
        assert chan.output(1) == b"aaaa"
        dog.io.ack(1, "o", 4)  # room for what the pipe holds
        chan.until(lambda msgs: chan.output(1) == b"aaaabbbbcccc")
        assert not _count("eof", 1)([m for m in chan.messages() if m.get("s") == "o"])
        dog.io.stop()  # the job ends: read to the end whatever is acknowledged
        chan.until(lambda msgs: any(m.get("ev") == "eof" and m["id"] == 1 and m["s"] == "o" for m in msgs))
    finally:
        dog.stopping.set()
        dog.teardown()


class SlowChannel(Channel):
    """A channel whose writes of a process's end take a while (a busy ssh connection)."""

    def write(self, data: bytes) -> None:
        if b'"ev":"exit"' in data or b'"ev":"eof"' in data:
            time.sleep(0.3)
        super().write(data)


@pytest.mark.proc  # its process starts in launchkit's code (tests/tiers.py)
def test_the_ends_and_last_output_are_written_before_the_teardown_returns() -> None:
    """The watchdog says ``bye`` when its teardown returns and writes nothing after it: every
    process's ``exit``, its streams' ``eof`` and what it printed as it was stopped come first
    (CI saw ``bye`` without the ``exit`` of a process the teardown had ended)."""
    chan = SlowChannel()
    dog = watchdog.Watchdog(chan)  # type: ignore[arg-type]
    dog.hello({"job": "cio-3", "hb_interval": 60, "grace": 2})
    code = "trap 'echo stopped $0; exit 3' TERM; echo up $0; while :; do sleep 0.05; done"
    for i in range(3):
        argv = ["sh", "-c", code, str(i)]
        dog.spawns({"procs": [{"id": i, "argv": argv, "env": {"LAUNCHKIT_JOB_ID": "cio-3"}, "cwd": "/"}]})
    chan.until(lambda msgs: _count("out")(msgs) == 3)
    dog.stopping.set()
    dog.teardown()
    msgs = chan.messages()
    assert sorted((m["id"], m["rc"]) for m in msgs if m.get("ev") == "exit") == [(0, 3), (1, 3), (2, 3)]
    assert sorted((m["id"], m["s"]) for m in msgs if m.get("ev") == "eof") == [
        (i, s) for i in range(3) for s in "eo"
    ]
    out = [
        b"".join(m["data"] for m in msgs if m.get("ev") == "out" and (m["id"], m["s"]) == (i, "o"))
        for i in range(3)
    ]
    assert out == [f"up {i}\nstopped {i}\n".encode() for i in range(3)]
