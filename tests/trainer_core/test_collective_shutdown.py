"""A rank that shuts down (closes its group: ``collective.shutdown()``, ``JobGroup.close``) while
the others wait for it in a collective, among real worker processes: every waiting rank learns at
once that it finished, with an error naming it and the operation they wait in, instead of waiting
for it until a stall bound (before, they only warned, every ``TRAINER_CORE_STALL_CHECK_SECONDS``).
What the rank took part in before it shut down completes on every rank."""

from __future__ import annotations

import pytest

from tests.trainer_core.cluster import run_job

CODE = """
import json, time
import numpy as np
from trainer_core.collective import join
g = join()
r = g.rank
total = g.allreduce(np.full(100_003, r + 1, np.float32), name="last.together")
if r == %(gone)d:
    started = time.monotonic()
    g.close()  # finishes: waits in the scheduler's finish for the others
    print("RESULT " + json.dumps({"rank": r, "closed": time.monotonic() - started}), flush=True)
else:
    started = time.monotonic()
    try:
        g.allreduce(np.ones(1000, np.float32), name="grad.3")
        out = {"rank": r, "error": None}
    except Exception as exc:
        out = {"rank": r, "error": f"{type(exc).__name__}: {exc}", "node": getattr(exc, "node", None)}
    out["after"] = time.monotonic() - started
    out["sum"] = float(total[0])
    print("RESULT " + json.dumps(out), flush=True)
    g.close()
"""


@pytest.mark.parametrize(("workers", "gone", "shm"), [(3, 1, "1"), (3, 1, "0"), (2, 0, "1"), (4, 3, "0")])
def test_a_rank_that_shut_down_fails_the_others_wait_at_once_naming_it(
    workers: int, gone: int, shm: str
) -> None:
    env = {"PS_SHM": shm}  # the stall warning stays at its default, 60 s
    job = run_job(CODE % {"gone": gone}, workers, 0, env, timeout=40)
    want = sum(range(1, workers + 1))
    for p in job.workers:
        (res,) = p.results()
        assert p.popen.returncode == 0, job.outputs()
        if p.rank == gone:
            continue
        assert res["sum"] == want, res  # the operation before the shutdown completed
        error = res["error"] or ""
        assert error.startswith("PeerShutDown: collective: rank "), job.outputs()
        assert f"rank {gone} (worker {gone} on 127.0.0.1) shut down" in error, error
        assert "allreduce 'grad.3'" in error, error
        assert res["node"] == f"rank {gone}", res
        assert res["after"] < 2.0, res
        assert "collective stall" not in p.output()
    assert job.codes()["scheduler 0"] == 0, job.outputs()
