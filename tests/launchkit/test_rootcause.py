"""The root-cause choice in-process: Tail, Blame and named_root driven by hand (the real processes
are in test_launch_e2e.py's root-cause tests)."""

from __future__ import annotations

import io
from dataclasses import dataclass

from rich.console import Console

from dmlc_env.ending import PeerFailure, peer_failed_line, waited_line
from launchkit.cli.launch import report
from launchkit.console import Ui
from launchkit.core.spec import LOCALHOST, JobResult, Task, TaskResult
from launchkit.rootcause import OUTPUT_WAIT, Blame, Tail, named_root, peer_of, waited_by

SAYS_W1 = peer_failed_line("worker 1")


def tail(*lines: str) -> Tail:
    t = Tail(3)
    t.extend(lines)
    return t


def test_tail_remembers_the_line_after_it_scrolled_out() -> None:
    t = tail("x", SAYS_W1)
    for i in range(10):
        t.append(f"traceback line {i}")
    assert SAYS_W1 not in t and len(t) == 3
    assert t.peer == PeerFailure("worker", 1)
    assert tail("ERROR:trainer_core:" + peer_failed_line(None)).peer == PeerFailure(None)
    assert tail("dmlc_env: this node ends because worker 1 failed, says the user").peer is None


def ended() -> bool:
    return True


def running() -> bool:
    return False


def test_a_process_that_failed_on_its_own_is_the_root_at_once() -> None:
    b = Blame(peer_wait=3.0)
    b.add(2, 10.0, tail("Traceback", "ValueError: x"), ended)
    assert b.decide(10.0) and b.root == 2


def test_a_reporter_waits_for_the_process_that_failed_on_its_own() -> None:
    b = Blame(peer_wait=3.0)
    b.add(0, 10.0, tail(SAYS_W1), ended)  # the scheduler: first to exit
    assert not b.decide(10.5)
    b.add(4, 10.6, tail("ValueError: boom"), ended)  # worker 1, later
    assert b.decide(10.6) and b.root == 4


def test_a_failure_whose_output_is_not_read_yet_is_judged_when_it_is() -> None:
    b = Blame(peer_wait=3.0)
    out = tail()
    b.add(0, 10.0, out, running)
    b.add(4, 10.1, tail("ValueError"), ended)
    assert not b.decide(10.2)  # the first one may still say it only reports another
    out.append(SAYS_W1)
    assert b.decide(10.2) and b.root == 4
    b = Blame(peer_wait=3.0)
    b.add(0, 10.0, tail(), running)  # its streams never end (a grandchild holds them)
    assert not b.decide(10.0 + OUTPUT_WAIT / 2) and b.decide(10.0 + OUTPUT_WAIT) and b.root == 0


def test_only_reporters_begin_the_teardown_after_the_wait_or_when_forced() -> None:
    b = Blame(peer_wait=3.0)
    b.add(0, 10.0, tail(SAYS_W1), ended)
    b.add(1, 10.1, tail(SAYS_W1), ended)
    assert not b.decide(12.9)
    assert b.decide(13.0) and b.root == 0
    b = Blame(peer_wait=3.0)
    b.add(0, 10.0, tail(SAYS_W1), ended)
    assert b.decide(10.1, force=True) and b.root == 0  # a signal, or nothing left to wait for
    assert not Blame(3.0).decide(99.0, force=True)  # no failure: nothing to decide


@dataclass
class P:
    task: Task
    tail: Tail
    result: TaskResult | None


def procs(tails: list[Tail], failed: set[int]) -> list[P]:
    roles = [("scheduler", 0), ("server", 0), ("worker", 0), ("worker", 1)]
    out = []
    for i, ((role, rank), t) in enumerate(zip(roles, tails, strict=True)):
        task = Task(role, rank, i, LOCALHOST, 0, ("x",))
        out.append(P(task, t, TaskResult(task, 1 if i in failed else 0, None, 0.0)))
    return out


def test_named_root_names_the_node_a_reporter_names() -> None:
    tails = [tail(SAYS_W1), tail("serving"), tail(SAYS_W1), tail("worker 1 stops")]
    assert named_root(0, procs(tails, {0, 2, 3})) == (3, 0)
    assert named_root(3, procs(tails, {0, 2, 3})) == (3, None)  # it failed on its own
    # the node named succeeded, or is not a process of this job: the reporter stays the root
    assert named_root(0, procs(tails, {0, 2})) == (0, None)
    alone = [tail(peer_failed_line("worker 7")), tail("serving"), tail("x"), tail("y")]
    assert named_root(0, procs(alone, {0, 2, 3})) == (0, None)


def test_the_scheduler_is_named_as_the_reporter_whichever_relay_exited_first() -> None:
    """A hung worker: the scheduler gives up on its heartbeats and aborts the job; a server may exit
    before the scheduler does (and so be the first failure), but the scheduler judged the worker,
    so it is the one said to have reported it (the CI run of stop 42 named the server)."""
    tails = [tail(SAYS_W1), tail(SAYS_W1), tail(SAYS_W1), tail("worker 1 stops")]
    assert named_root(1, procs(tails, {0, 1, 2, 3})) == (3, 0)
    assert named_root(2, procs(tails, {0, 1, 2, 3})) == (3, 0)
    # a scheduler that exited 0 or names no node is not said to have reported it
    assert named_root(1, procs(tails, {1, 2, 3})) == (3, 1)
    other = [tail("bye"), tail(SAYS_W1), tail(SAYS_W1), tail("worker 1 stops")]
    assert named_root(2, procs(other, {0, 1, 2, 3})) == (3, 2)


def test_a_node_that_exited_0_while_others_waited_for_it_is_the_root() -> None:
    """Worker 1 exited 0 early: the reporters that say they waited for it in an operation name it
    (its exit 0 alone would not blame it), and ``waited_by`` says who waited in what."""
    waited = str(waited_line("worker 1", "allreduce (operation 3)"))
    tails = [tail(waited, SAYS_W1), tail("serving"), tail(waited, "Traceback", SAYS_W1), tail("bye")]
    assert named_root(0, procs(tails, {0, 2})) == (3, 0)
    assert (
        waited_by(3, procs(tails, {0, 2}))
        == "scheduler 0 and worker 0 waited for it in allreduce (operation 3)"
    )
    tails[0] = tail(SAYS_W1)
    assert waited_by(3, procs(tails, {0, 2})) == "worker 0 waited for it in allreduce (operation 3)"
    tails[2] = tail(SAYS_W1)  # nobody says it waited for worker 1: its exit 0 does not blame it
    assert named_root(0, procs(tails, {0, 2})) == (0, None)
    assert waited_by(3, procs(tails, {0, 2})) == ""


def test_a_waited_line_reports_the_node_waited_for_without_a_line_naming_it() -> None:
    """A rank that failed waiting for a rank that shut down prints its waited line and, at most,
    a line naming no node (``another node``: its error names ``rank 1``): it reports worker 1's
    end, it did not fail on its own; a line that names a node keeps its word."""
    waited = str(waited_line("worker 1", "allreduce 'grad.3' (operation 2)"))
    assert peer_of(tail(waited, "PeerShutDown: ...")) == PeerFailure("worker", 1)
    assert peer_of(tail(waited, peer_failed_line(None))) == PeerFailure("worker", 1)
    assert peer_of(tail(waited, peer_failed_line("worker 0"))) == PeerFailure("worker", 0)
    b = Blame(peer_wait=3.0)
    b.add(2, 10.0, tail(waited, "PeerShutDown: ..."), ended)
    assert not b.decide(10.5)  # it waits for the node it names, as for any reporter
    # worker 1 exited 0 (shut down): named, with who waited in what
    tails = [tail("scheduler"), tail("serving"), tail(waited, "PeerShutDown: ..."), tail("bye")]
    assert named_root(2, procs(tails, {2})) == (3, 2)
    assert waited_by(3, procs(tails, {2})) == "worker 0 waited for it in allreduce 'grad.3' (operation 2)"
    # it finished, and the job's end was told to it: its line naming worker 0 does not spare it
    tails[3] = tail(peer_failed_line("worker 0"), "bye")
    assert named_root(2, procs(tails, {2})) == (3, 2)
    # it failed in its finish by the job's end (no scheduler left): still the one waited for
    tails[3] = tail(peer_failed_line("scheduler"), "NodeFailure: scheduler closed its connection")
    assert named_root(2, procs(tails, {2, 3})) == (3, 2)
    # it waited in an operation itself, for worker 0: the two only report each other
    tails[3] = tail(str(waited_line("worker 0", "allreduce 'grad.3' (operation 2)")), "LinkError")
    assert named_root(2, procs(tails, {2, 3})) == (2, None)


def test_the_report_says_who_waited_for_the_root_cause_in_what() -> None:
    """It exited 0 (named by a waiting worker), or failed on its own, while others waited."""
    w0, w1 = (Task("worker", r, r, LOCALHOST, 0, ("x",)) for r in range(2))
    waits = "workers 0 and 2 waited for it in allreduce 'grad.3' (operation 2)"
    left = TaskResult(w1, 0, None, 0.0, tail=("bye",))
    by = TaskResult(w0, 1, None, 0.0, tail=("PeerShutDown: ...",))
    raised = TaskResult(w1, 1, None, 0.0, tail=("ValueError: boom",))
    for root, named_by, how in [
        (left, by, "exited 0 while " + waits + " (as worker 0 reported, exit 1)"),
        (raised, None, "exited with code 1 while " + waits),
    ]:
        err = io.StringIO()
        result = JobResult(
            "1201-000000-abcdef", 1, (by, root), root_cause=root, named_by=named_by, waited_by=waits
        )
        report(Ui(err=Console(file=err, width=400)), result)
        assert f"failed: worker 1 on localhost {how}\n" in err.getvalue(), err.getvalue()
