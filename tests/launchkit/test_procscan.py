"""``launchkit/hostside/procscan.py`` in process: a job's shared-memory names go at its end,
and nothing of another job's."""

from __future__ import annotations

import os
import uuid

from launchkit.hostside import procscan


def test_remove_shm_takes_the_jobs_segments_only() -> None:
    job = f"shm-{uuid.uuid4().hex[:8]}"
    mine = [f"launchkit-{job}-a", f"launchkit-{job}-b-0"]
    others = [f"launchkit-{job}x-a", f"launchkit-other{job}-a", f"{job}-a"]  # (a longer id, another)
    paths = [os.path.join(procscan.SHM_DIR, n) for n in mine + others]
    for p in paths:
        with open(p, "wb") as f:
            f.write(b"x")
    try:
        assert procscan.remove_shm(job) == 2
        assert [os.path.exists(p) for p in paths] == [False, False, True, True, True]
        assert procscan.remove_shm(job) == 0
    finally:
        for p in paths:
            if os.path.exists(p):
                os.unlink(p)
