"""The yarn follower (``launchkit.backends.yarnrun``), driven by a scripted ResourceManager."""

from __future__ import annotations

import signal
import threading

import pytest

from launchkit.backends.yarnrest import YarnError
from launchkit.backends.yarnrun import YarnRun
from launchkit.hostside import shim
from tests.launchkit.test_backend_yarn import plan_for

pytestmark = pytest.mark.timeout(20)


# -- the follower, against a scripted ResourceManager --------------------------------------------
class ScriptedRM:
    """Answers GETs from a list (the last one repeats); records every call."""

    def __init__(self, views: list, app: dict | None = None) -> None:
        self.views = list(views)
        self.app_report = app
        self.calls: list[str] = []
        self.base_url = "http://rm"
        self.user = "me"

    def create(self, spec: dict) -> dict:
        self.calls.append("POST")
        return {"diagnostics": "Application ID: application_1_0001"}

    def get(self, name: str):
        self.calls.append("GET")
        view = self.views.pop(0) if len(self.views) > 1 else self.views[0]
        if isinstance(view, Exception):
            raise view
        return view

    def stop(self, name: str) -> str:
        self.calls.append("PUT")
        self.views = [{"name": name, "state": "STOPPED"}]
        return "stopped"

    def destroy(self, name: str) -> str:
        self.calls.append("DELETE")
        self.views = [None]
        return "destroyed"

    def app(self, app_id: str):
        self.calls.append("APP")
        return self.app_report


def _view(state: str, containers: dict[str, str]) -> dict:
    comps: dict[str, list] = {}
    for inst, cstate in containers.items():
        comps.setdefault(inst.rsplit("-", 1)[0], []).append(
            {"id": f"c_{inst}", "state": cstate, "bare_host": "node7", "component_instance_name": inst}
        )
    return {
        "name": "lk",
        "id": "application_1_0001",
        "state": state,
        "components": [{"name": n, "containers": cs} for n, cs in comps.items()],
    }


def follow(
    rm: ScriptedRM, n: int = 1, s: int = 1, *, stop_after: int | None = None, **kw
) -> tuple[int, dict]:
    """Run a YarnRun to its end; (engine code, {plan index: [(kind, fields)]})."""
    plan = plan_for(n=n, s=s, command=("x",))
    run = YarnRun(rm, {"name": "lk"}, plan, poll=0.01, **kw)  # type: ignore[arg-type]
    events: dict[int, list] = {}
    lock = threading.Lock()

    def feed(line: bytes) -> None:
        frame = shim.parse_frame(line)
        if frame is not None and frame.kind in ("s", "x"):
            with lock:
                events.setdefault(frame.task, []).append((frame.kind, frame.fields()))
                if stop_after is not None and sum(len(v) for v in events.values()) == stop_after:
                    run.signal(signal.SIGTERM)

    run.start(feed, feed)
    return run.wait(), events


def test_follower_frames_starts_and_two_end_marks_per_container() -> None:
    rm = ScriptedRM(
        [
            _view("ACCEPTED", {}),
            _view("STARTED", {"scheduler-0": "RUNNING_BUT_UNREADY"}),
            _view("STABLE", {"scheduler-0": "READY", "server-0": "READY", "worker-0": "READY"}),
            _view("STABLE", {"scheduler-0": "READY", "server-0": "READY", "worker-0": "SUCCEEDED"}),
            _view(
                "SUCCEEDED", {"scheduler-0": "SUCCEEDED", "server-0": "SUCCEEDED", "worker-0": "SUCCEEDED"}
            ),
        ]
    )
    code, events = follow(rm)
    assert code == 0
    for index in range(3):
        assert events[index][0] == ("s", ["0", "node7", "lk", "-"])
        assert events[index][1:] == [("x", ["0", "0"]), ("x", ["0", "0"])]
    assert rm.calls[0] == "POST" and rm.calls[-1] == "DELETE"  # a finished service is deleted


def test_failed_container_is_code_1_and_a_launcher_stop_is_143_stopped() -> None:
    rm = ScriptedRM([_view("STABLE", {"scheduler-0": "READY", "server-0": "READY", "worker-0": "FAILED"})])
    code, events = follow(rm, stop_after=5)  # 3 starts + the worker's two ends: the launcher stops it
    assert code == 143
    assert events[2][1:] == [("x", ["1", "0"]), ("x", ["1", "0"])]  # worker 0: FAILED -> 1
    assert events[0][1:] == events[1][1:] == [("x", ["143", "1"]), ("x", ["143", "1"])]
    assert "PUT" in rm.calls and rm.calls[-1] == "DELETE"


def test_a_job_that_ended_between_two_polls_asks_the_rm_how_it_ended() -> None:
    stub = {"name": "lk", "id": "application_1_0001", "state": "STOPPED"}  # all ServiceClient says
    code, events = follow(ScriptedRM([stub], {"state": "FINISHED", "finalStatus": "SUCCEEDED"}))
    assert code == 0 and all(ev[-2:] == [("x", ["0", "0"])] * 2 for ev in events.values())
    code, events = follow(ScriptedRM([stub], {"state": "FINISHED", "finalStatus": "FAILED"}))
    assert code == 1 and not events  # the tasks are lost: the engine backend reports them with code 1
    diag = "Application is killed by ResourceManager as it has exceeded the lifetime period."
    code, _ = follow(ScriptedRM([stub], {"state": "KILLED", "finalStatus": "KILLED", "diagnostics": diag}))
    assert code == 124
    code, _ = follow(ScriptedRM([stub], None))
    assert code == 1


def test_an_unreachable_rm_is_retried_then_the_job_is_lost() -> None:
    done = {"scheduler-0": "SUCCEEDED", "server-0": "SUCCEEDED", "worker-0": "SUCCEEDED"}
    rm = ScriptedRM([YarnError("cannot reach"), _view("SUCCEEDED", done)])
    code, events = follow(rm)
    assert code == 0 and len(events) == 3
    code, events = follow(ScriptedRM([YarnError("cannot reach")]), rm_lost_after=0.05)
    assert code == 255 and not events  # lost: the engine backend ends them with 255


def test_sigkill_deletes_at_once() -> None:
    rm = ScriptedRM([_view("STABLE", {"scheduler-0": "READY", "server-0": "READY", "worker-0": "READY"})])
    plan = plan_for(n=1, s=1, command=("x",))
    run = YarnRun(rm, {"name": "lk"}, plan, poll=0.01)  # type: ignore[arg-type]
    ends: list = []
    run.start(lambda line: ends.append(line) if b" x " in line else None, lambda line: None)
    run.signal(signal.SIGKILL)
    assert run.wait() == 143 and rm.calls.count("DELETE") == 1 and "PUT" not in rm.calls
    assert sum(1 for e in ends if e.endswith(b" x 143 1\n")) == 6


def test_a_stop_that_yarn_never_confirms_ends_after_a_bounded_wait() -> None:
    class Deaf(ScriptedRM):
        def stop(self, name: str) -> str:
            self.calls.append("PUT")
            raise YarnError("cannot reach")

        def destroy(self, name: str) -> str:
            self.calls.append("DELETE")
            raise YarnError("cannot reach")

    rm = Deaf([_view("STABLE", {"scheduler-0": "READY", "server-0": "READY", "worker-0": "READY"})])
    plan = plan_for(n=1, s=1, command=("x",))
    run = YarnRun(rm, {"name": "lk"}, plan, poll=0.01, stop_wait=5, kill_wait=0.2)  # type: ignore[arg-type]
    ends: list = []
    run.start(lambda line: ends.append(line) if b" x " in line else None, lambda line: None)
    run.signal(signal.SIGTERM)
    run.signal(signal.SIGKILL)  # the grace period passed: wait no longer than kill_wait
    assert run.wait() == 143 and sum(1 for e in ends if e.endswith(b" x 143 1\n")) == 6
    assert rm.calls.count("PUT") == 1 and "DELETE" in rm.calls
