"""The supervisor with an engine that never confirms an end (in-process, a fake backend)."""

from __future__ import annotations

import io
import os
import signal
import threading
import time

import pytest
from rich.console import Console

from launchkit.backends.base import Backend
from launchkit.console import OutputWriter, Ui
from launchkit.core.spec import LaunchSpec, Task
from launchkit.jobs import records as jobs
from launchkit.launching import restart_cause
from launchkit.supervisor import Supervisor
from tests.launchkit.plans import make_plan


class Stuck:
    """A process whose end is never reported (an engine that stopped answering)."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self.pid: int | None = 4242
        r1, self._w1 = os.pipe()
        r2, self._w2 = os.pipe()
        self.stdout = os.fdopen(r1, "rb")
        self.stderr = os.fdopen(r2, "rb")
        self.signals: list[int] = []

    def wait(self) -> int:
        threading.Event().wait()  # forever
        return 0

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)


class Quick(Stuck):
    def wait(self) -> int:
        time.sleep(0.2)
        return 3  # fails: the job is torn down


class StuckBackend(Backend):
    name = "fake"

    def __init__(self) -> None:
        self.handles: list[Stuck] = []

    def start(self, task: Task) -> Stuck:
        h: Stuck = Quick(task) if task.role == "worker" else Stuck(task)
        self.handles.append(h)
        return h


@pytest.mark.proc  # its process starts in launchkit's code (tests/tiers.py)
def test_a_process_that_never_confirms_its_end_is_given_up(tmp_path) -> None:
    spec = LaunchSpec(num_workers=1, num_servers=1, command=("x",), cwd=str(tmp_path))
    plan = make_plan(spec, job_id="t-giveup", secret="s", root_uri="127.0.0.1", root_port=1)
    err = io.StringIO()
    ui = Ui(Console(file=io.StringIO()), Console(file=err))
    backend = StuckBackend()
    sup = Supervisor(
        plan, backend, ui, writer=OutputWriter(io.BytesIO(), io.BytesIO()), grace=0.2, kill_confirm=0.5
    )
    t0 = time.monotonic()
    result = sup.run()
    assert time.monotonic() - t0 < 10
    assert result.exit_code == 3 and result.root_cause is not None and result.root_cause.task.role == "worker"
    stuck = [h for h in backend.handles if not isinstance(h, Quick)]
    assert all(h.signals[:2] == [15, 9] for h in stuck)
    assert "did not confirm their end" in err.getvalue()
    assert {r.exit_code for r in result.results if r.task.role != "worker"} == {137}
    assert sup.reaper is not None and sup.reaper.wait(10) is not None  # its pipe was closed: it ended


class Ended(Stuck):
    """A process that ended at once (a worker with 3, the others with 0), its streams closed."""

    def __init__(self, task: Task) -> None:
        super().__init__(task)
        os.close(self._w1)
        os.close(self._w2)

    def wait(self) -> int:
        return 3 if self.task.role == "worker" else 0


class SignalledAfterTheEnd(StuckBackend):
    """Every process ends at once; SIGTERM reaches the launcher while it waits for the backend's
    helpers, after the last process ended (``launchkit kill`` or Ctrl-C a moment late)."""

    def start(self, task: Task) -> Ended:
        h = Ended(task)
        self.handles.append(h)
        return h

    def wait_ended(self, timeout: float) -> None:
        os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.proc  # its process starts in launchkit's code (tests/tiers.py)
def test_a_signal_after_the_last_process_ended_still_counts(tmp_path) -> None:
    spec = LaunchSpec(num_workers=1, num_servers=1, command=("x",), cwd=str(tmp_path))
    plan = make_plan(spec, job_id="t-late-signal", secret="s", root_uri="127.0.0.1", root_port=1)
    ui = Ui(Console(file=io.StringIO()), Console(file=io.StringIO()))
    sup = Supervisor(
        plan, SignalledAfterTheEnd(), ui, writer=OutputWriter(io.BytesIO(), io.BytesIO()), grace=0.2
    )
    before = signal.getsignal(signal.SIGTERM)
    result = sup.run()
    assert signal.getsignal(signal.SIGTERM) is before  # the launcher's handlers are back
    assert result.exit_code == 3 and result.root_cause is not None  # the worker's failure stands
    assert result.signalled == signal.SIGTERM  # and the signal is not lost: no restart follows
    assert restart_cause(result, 0, 3) is None


class Succeeded(Ended):
    """A process that ended at once with 0, its pid known only once the backend awaited its start."""

    def __init__(self, task: Task) -> None:
        super().__init__(task)
        self.pid = None

    def wait(self) -> int:
        return 0


class StartsLater(StuckBackend):
    """A backend that asks for every start without waiting (ssh): the pids come in await_started."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def start(self, task: Task) -> Succeeded:
        h = Succeeded(task)
        self.handles.append(h)
        return h

    def await_started(self) -> None:
        self.calls.append("await_started")
        for i, h in enumerate(self.handles):
            h.pid = 5000 + i

    def record_info(self) -> dict[str, object] | None:
        self.calls.append("record_info")
        return {"hosts": ["h1"]}


@pytest.mark.proc  # its process starts in launchkit's code (tests/tiers.py)
def test_the_record_is_built_after_the_backend_awaited_every_start(tmp_path) -> None:
    spec = LaunchSpec(num_workers=2, num_servers=1, command=("x",), cwd=str(tmp_path))
    plan = make_plan(spec, job_id="t-await", secret="s", root_uri="127.0.0.1", root_port=1)
    ui = Ui(Console(file=io.StringIO()), Console(file=io.StringIO()))
    record = jobs.started_here(
        id=plan.job_id, name="t", backend="fake", hosts=("h1",), command=("x",), cwd=str(tmp_path)
    )
    backend = StartsLater()
    sup = Supervisor(
        plan, backend, ui, writer=OutputWriter(io.BytesIO(), io.BytesIO()), grace=0.2, record=record
    )
    assert sup.run().exit_code == 0
    # and read once more as the job ends (ssh: which watchdogs confirmed their sweep)
    assert backend.calls == ["await_started", "record_info", "record_info"]
    saved = jobs.read(jobs.jobs_dir() / f"{plan.job_id}.json")
    assert [p.pid for p in saved.processes] == [5000 + i for i in range(len(plan.tasks))]
    assert saved.remote == {"hosts": ["h1"]} and saved.state == "succeeded"
