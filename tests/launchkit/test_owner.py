"""Whose job a process is (``launchkit.jobs.owner``), in process: ``kill --all`` ends this home's
jobs and strays, and leaves another home's, another machine's and a process that names no home
(issue 40)."""

from __future__ import annotations

import os
from pathlib import Path

from launchkit.jobs import owner
from launchkit.jobs.kill import AllPlan
from launchkit.jobs.owner import Seen, decide

ME = "node1:/home/al/.launchkit"
OTHER = "node1:/tmp/other-home"
RECORDED = {("/tmp/other-home", "a-job")}  # the other home records a-job only


def verdicts(*seen: Seen, mine: tuple[str, ...] = ()) -> dict[str, tuple[str, str]]:
    found = decide(seen, mine=mine, me=ME, recorded=lambda path, job: (path, job) in RECORDED)
    return {v.job_id: (v.kind, v.why) for v in found}


def test_this_homes_jobs_are_ended_recorded_or_not() -> None:
    got = verdicts(
        Seen("mine", ME, 2), Seen("unmarked-mine", "", 1), Seen("gone", ME, 1), mine=("mine", "unmarked-mine")
    )
    assert got["mine"] == ("this home", "recorded here")
    assert got["unmarked-mine"] == ("this home", "recorded here")  # an older launcher's job of this home
    assert got["gone"][0] == "this home"  # its record was removed: still this home's


def test_another_homes_job_is_left_and_a_stray_is_ended() -> None:
    got = verdicts(Seen("a-job", OTHER, 1), Seen("b-job", OTHER, 1), Seen("c-job", "node1:/nonexistent", 3))
    assert got["a-job"] == ("another home", "recorded in /tmp/other-home")
    assert got["b-job"] == ("stray", "a stray: its home /tmp/other-home has no record of it")
    assert got["c-job"] == ("stray", "a stray: its home /nonexistent has no record of it")


def test_what_cannot_be_told_here_is_left() -> None:
    got = verdicts(Seen("far", "node2:/home/al/.launchkit", 1), Seen("bare", "", 1), Seen("odd", "x", 1))
    assert got["far"][0] == "another machine" and "launched from node2" in got["far"][1]
    assert got["bare"][0] == "no home"
    assert got["odd"][0] == "no home"
    assert not any(v.end for v in decide([Seen("bare", "", 1)], mine=(), me=ME, recorded=lambda p, j: False))


def test_a_job_naming_several_homes_is_left_unless_each_makes_it_a_stray() -> None:
    mixed = verdicts(Seen("a-job", OTHER, 1), Seen("a-job", "node1:/nowhere", 1))
    assert mixed["a-job"][0] == "another home"
    both = decide(
        [Seen("x", "node1:/p", 1), Seen("x", "node1:/q", 2)], mine=(), me=ME, recorded=lambda p, j: False
    )
    assert [(v.kind, v.count) for v in both] == [("stray", 3)]


def test_all_plan_ends_the_listed_jobs_and_the_ended_verdicts() -> None:
    here = tuple(
        decide([Seen("s", "node1:/gone", 1), Seen("o", OTHER, 1)], mine=(), me=ME, recorded=lambda p, j: True)
    )
    plan = AllPlan(("lost-one", "running-one"), here, frozenset({"lost-one", "running-one"}), ME)
    assert plan.to_end() == ["lost-one", "running-one"]  # "s" is recorded in /gone (the lookup says so)
    stray = tuple(decide([Seen("s", "node1:/gone", 1)], mine=(), me=ME, recorded=lambda p, j: False))
    assert AllPlan(("r",), stray, frozenset({"r"}), ME).to_end() == ["r", "s"]
    # a host's scan is judged the same way, with this home's records
    assert [v.kind for v in plan.on_host({"running-one": {"": 2}, "z": {"node9:/h": 1}})] == [
        "this home",
        "another machine",
    ]


def test_recorded_in_looks_at_the_homes_record_file(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "1201-000000-abcdef.json").write_text("not even json")  # unreadable: still a record
    assert owner.recorded_in(str(tmp_path), "1201-000000-abcdef")
    assert not owner.recorded_in(str(tmp_path), "1201-000000-000000")
    assert not owner.recorded_in(str(tmp_path / "removed"), "1201-000000-abcdef")
    assert not owner.recorded_in(str(tmp_path), "../jobs/1201-000000-abcdef")  # not a job id


def test_home_id_is_the_host_and_the_real_path(tmp_path: Path, monkeypatch) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    monkeypatch.setenv("LAUNCHKIT_HOME", str(tmp_path / "link"))
    assert owner.home_id("h1") == f"h1:{os.path.realpath(real)}"
    assert owner.split(owner.home_id("h1")) == ("h1", os.path.realpath(real))
    assert owner.split("h1:relative") is None and owner.split("") is None
