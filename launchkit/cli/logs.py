"""``launchkit logs JOB_ID``: a job's output after the fact, or as it comes (``--follow``).

Every job launched on this machine keeps its processes' output beside its record
(``launchkit.jobs.keptoutput``); a detached batch job's output file is split back into processes;
a job of an older launchkit shows what ``--log-dir`` kept. Lines are prefixed ``[role rank]`` as
the launch prints them, a process's stdout lines go to stdout and its stderr lines to stderr,
one process after another (scheduler, servers, workers), or only those ``--role`` and ``--rank``
pick; ``--tail N`` prints the last N lines of each stream; ``--follow`` goes on printing new
lines as they come, until the job ends."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import typer

from launchkit.cli.app import get_app
from launchkit.cli.coercion import Command
from launchkit.console import Ui
from launchkit.errors import LaunchkitError, UsageError
from launchkit.jobs import detached, keptoutput, live
from launchkit.jobs import records as jobs

ROLES = ("scheduler", "server", "worker")
POLL = 0.2


def last(lines: list[str], tail: int | None) -> list[str]:
    """The last ``tail`` of ``lines`` (all of them when None)."""
    return lines if tail is None else lines[len(lines) - tail :]


def picked(role: str | None, rank: int | None, of: tuple[str, int]) -> bool:
    return (role is None or of[0] == role) and (rank is None or of[1] == rank)


def emit(ui: Ui, k: keptoutput.Kept, lines: list[str]) -> None:
    """Lines as the launch's console got them, control characters included: a progress bar's
    carriage returns (rich's print dropped them and ran the bar's states into one line)."""
    if not lines:
        return
    target = (ui.out if k.stream == "stdout" else ui.err).file
    target.write("".join(f"[{k.role} {k.rank}] {text}\n" for text in lines))
    target.flush()


def head(k: keptoutput.Kept, tail: int | None) -> tuple[list[str], int]:
    """The complete lines kept so far (the last ``tail``), and the byte offset after them in
    the current file, where following starts."""
    older = list(k.paths[:-1])
    lines = keptoutput.last_lines(tuple(older), tail) if older else []
    data = b""
    with contextlib.suppress(FileNotFoundError), open(k.paths[-1], "rb") as f:
        data = f.read()
    cut = data.rfind(b"\n") + 1
    lines += [x.decode(errors="replace").rstrip("\r") for x in data[: cut - 1].split(b"\n")] if cut else []
    return last(lines, tail), cut


def show_kept(
    ui: Ui, job_id: str, pick: tuple[str | None, int | None], tail: int | None, follow: bool
) -> None:
    """The kept streams ``pick`` selects; with ``follow``, new lines (and new streams) as they
    come, until the job ends."""
    followers: dict[Path, tuple[keptoutput.Kept, Iterator[list[str]]]] = {}

    def take_new(offset_of: bool) -> None:
        for k in keptoutput.kept(job_id):
            if k.paths[-1] not in followers and picked(*pick, (k.role, k.rank)):
                lines, offset = head(k, tail if offset_of else None)
                emit(ui, k, lines)
                followers[k.paths[-1]] = (k, keptoutput.follow(k.paths[-1], offset))

    take_new(True)
    while follow:
        record = jobs.load(job_id)
        ended = record is None or record.shown_state != "running"
        take_new(False)
        for k, lines_after in followers.values():
            emit(ui, k, next(lines_after))
        if ended:  # one last read after the job ended: its streams are complete
            return
        time.sleep(POLL)


def show_changes(ui: Ui, record: jobs.JobRecord) -> None:
    """An elastic job's membership changes, after the output (on stderr, as the launch said them)."""
    for change in record.changes:
        ui.err.file.write(f"[launchkit] {change.line()}\n")
    ui.err.file.flush()


def gone(
    record: jobs.JobRecord, streams: list[keptoutput.Kept], pick: tuple[str | None, int | None]
) -> list[str]:
    """The streams of the picked processes that started (a pid) but whose kept file is missing,
    once the job no longer runs (files are made at a process's first write or soon after its
    start): deleted since."""
    if record.shown_state == "running":
        return []
    have = {(k.role, k.rank, k.stream) for k in streams}
    return [
        f"{p.role} {p.rank} {stream}"
        for p in record.processes
        if p.pid is not None and picked(*pick, (p.role, p.rank))
        for stream in ("stdout", "stderr")
        if (p.role, p.rank, stream) not in have
    ]


def gone_error(job_id: str, missing: list[str]) -> LaunchkitError:
    """Exit 1: what ``logs`` printed is not the whole of what was picked."""
    where = live.job_dir(job_id)
    return LaunchkitError(
        f"job {job_id}: the kept output of {', '.join(missing)} is gone from {where} (deleted?)"
    )


def show_detached(
    ui: Ui, record: jobs.JobRecord, role: str | None, rank: int | None, tail: int | None
) -> None:
    path = Path(record.remote["output"])  # type: ignore[index]
    if not path.exists():
        ui.text(f"no output yet ({path}); the job may still be waiting in the queue")
        return
    lines = []
    for label, _stream, text in detached.output_lines(record):
        r, _, n = label.partition(" ")
        if picked(role, rank, (r, int(n) if n.isdigit() else -1)):
            lines.append(f"[{label}] {text}")
    for line in last(lines, tail):
        ui.text(line)


def show_log_dir(ui: Ui, log_dir: str, role: str | None, rank: int | None, tail: int | None) -> bool:
    files = sorted(Path(log_dir).glob("*.std*"))
    for f in files:
        r, _, n = f.stem.rpartition("-")
        if not picked(role, rank, (r, int(n) if n.isdigit() else -1)):
            continue
        lines = f.read_text(errors="replace").splitlines()
        for text in last(lines, tail):
            ui.text(f"[{f.stem.replace('-', ' ')} {f.suffix[1:]}] {text}")
    return bool(files)


def register(app: typer.Typer) -> None:
    @app.command(
        cls=Command,
        help="Print a job's output: every process's, or one role's or rank's; --follow as it comes.",
    )
    def logs(
        ctx: typer.Context,
        job_id: str = typer.Argument(..., help="The job id (see launchkit ps)."),
        role: str = typer.Option(
            None, "--role", help="Only this role's processes: scheduler, server, worker."
        ),
        rank: int = typer.Option(None, "--rank", help="Only the processes of this rank."),
        follow: bool = typer.Option(
            False, "-f", "--follow", help="Go on printing new lines until the job ends."
        ),
        tail: int = typer.Option(None, "-n", "--tail", help="Only the last N lines of each stream."),
    ) -> None:
        ui = get_app(ctx).ui
        jobs.check_job_id(job_id)
        if role is not None and role not in ROLES:
            raise UsageError(f"--role {role!r}: expected one of {', '.join(ROLES)}")
        record = jobs.load(job_id, jobs.refuse)
        if record is None:
            raise UsageError(f"no job {job_id!r} here (see launchkit ps --all)")
        if record.submitting:  # (--detach, before the engine has answered: no output anywhere yet)
            ui.info(f"job {job_id} is being submitted ({record.backend}): it has no output yet")
            return
        if (record.remote or {}).get("output"):
            if follow:
                raise UsageError(
                    f"job {job_id} is a detached batch job: its output comes at its end (no --follow)"
                )
            show_detached(ui, record, role, rank, tail)
            return
        streams = keptoutput.kept(job_id)
        missing = gone(record, streams, (role, rank))
        shown = [k for k in streams if picked(role, rank, (k.role, k.rank))]
        if streams or (follow and record.shown_state == "running"):
            if streams and not shown and not missing:
                have = ", ".join(dict.fromkeys(f"{k.role} {k.rank}" for k in streams))
                which = " ".join(x for x in (role, None if rank is None else str(rank)) if x)
                raise UsageError(f"job {job_id} has no process {which} (its processes: {have})")
            show_kept(ui, job_id, (role, rank), tail, follow)
            if role in (None, "worker") and rank is None:
                show_changes(ui, jobs.load(job_id) or record)
            if missing:  # not silence, as if the process had printed nothing
                raise gone_error(job_id, missing)
            return
        if record.log_dir and show_log_dir(ui, record.log_dir, role, rank, tail):
            return
        if missing and live.job_dir(job_id).is_dir():  # this launchkit kept it: deleted since
            raise gone_error(job_id, missing)
        raise UsageError(
            f"job {job_id} kept no output (a job of an older launchkit: launch with --log-dir DIR)"
        )
