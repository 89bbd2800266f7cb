"""The launcher's end of the pipe to its reaper (in-process); the reaper's sweeps themselves are
tested on real jobs in tests/faults/."""

from __future__ import annotations

import os
from pathlib import Path

from launchkit.jobs.reaper import Cleanups


def test_cleanups_reach_the_pipe_until_it_is_closed_and_never_a_file_that_took_its_number(
    tmp_path: Path,
) -> None:
    r, w = os.pipe()
    cleanups = Cleanups(w)
    cleanups.add(["scancel", "42"])
    assert os.read(r, 1000) == b'["scancel", "42"]\n'
    cleanups.close()
    victim = tmp_path / "record.json"
    fd = os.open(victim, os.O_WRONLY | os.O_CREAT)  # takes the number the pipe gave back
    try:
        assert fd == w
        cleanups.add(["scancel", "43"])  # a late engine reader: dropped
        cleanups.close()  # twice: nothing
    finally:
        os.close(fd)
        os.close(r)
    assert victim.read_bytes() == b""
