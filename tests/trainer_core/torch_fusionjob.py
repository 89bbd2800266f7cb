"""A worker of test_torch_fusion_jobs.py: many small named ``allreduce_async``s as a Horovod script
submits them (sizes and dtypes vary; the last rank submits in reverse order), a grouped and an
in-place form, and a mismatch inside a batch; each rank prints one ``RESULT`` JSON line with its
results (as bytes, to compare bit for bit) and how many collectives its group ran."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

COUNT = 40
DTYPES = ("float32", "float64", "int32", "float16", "int64")


def tensor_input(i: int, rank: int) -> np.ndarray:
    """Rank ``rank``'s input ``i`` (the test computes its references from the same function)."""
    rng = np.random.default_rng(1000 * i + rank)
    return (rng.standard_normal(1 + (37 * i) % 300) * 100).astype(DTYPES[i % len(DTYPES)])


def average(i: int) -> bool:
    return i % 3 == 0


def main() -> None:
    import torch

    import trainer_core.torch as hvd
    from trainer_core.torch.runtime import default

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    group = default.backend().group  # type: ignore[attr-defined]
    out: dict[str, Any] = {"rank": r, "size": n}
    order = list(range(COUNT))[:: -1 if r == n - 1 else 1]
    before = group.collectives
    handles = {
        i: hvd.allreduce_async(
            torch.from_numpy(tensor_input(i, r)), name=f"t{i}", op=hvd.Average if average(i) else hvd.Sum
        )
        for i in order
    }
    results = [hvd.synchronize(handles[i]).numpy() for i in range(COUNT)]
    out["ran"] = group.collectives - before
    out["results"] = [x.tobytes().hex() for x in results]
    out["dtypes"] = [str(x.dtype) for x in results]
    grouped = hvd.grouped_allreduce([torch.full((k + 1,), float(r + k)) for k in range(5)], op=hvd.Sum)
    out["grouped"] = [g.tolist() for g in grouped]
    inplace = [torch.full((3,), float(r)) for _ in range(4)]
    hvd.synchronize(hvd.grouped_allreduce_async_(inplace, op=hvd.Sum))
    out["inplace"] = [t.tolist() for t in inplace]
    ok = [hvd.allreduce_async(torch.ones(4), name=f"ok{k}", op=hvd.Sum) for k in range(3)]
    bad = hvd.allreduce_async(torch.ones(5 if r == 1 else 4), name="bad", op=hvd.Sum)
    out["ok"] = [hvd.synchronize(h).tolist() for h in ok]
    try:
        hvd.synchronize(bad)
        out["bad"] = "no error"
    except ValueError as e:
        out["bad"] = f"{type(e).__name__}: {e}"
    out["after"] = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after").tolist()
    print("RESULT " + json.dumps(out), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
