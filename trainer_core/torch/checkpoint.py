"""Checkpoints of a ``DistributedOptimizer``'s training: the model's and the optimizer's state
dicts with trainer_core's own state (every rank's error-feedback residuals), so that a resumed job
continues exactly where an unbroken one would be.

``save(path, epoch, model, optimizer, extra)`` is collective (every worker calls it at the same
point). Every rank writes its own file, ``<path>.<epoch>.rank<r>`` (its residuals differ from the
others'; the model and optimizer are the same everywhere), written to a temporary name and renamed
(atomic); after a barrier rank 0 renames ``<path>`` into place, a small JSON file naming the epoch
and the worker count: the checkpoint is that epoch's from then on. After a second barrier every
rank removes its files of older epochs. A job killed at any point resumes from the last epoch
``<path>`` names, whose files are all there.

``load(path, model, optimizer)`` (every rank, after ``DistributedOptimizer`` is made) restores
them and returns ``(epoch, extra)``, or None when there is no checkpoint yet. Files are read with
``torch.load(weights_only=True)``: tensors, numbers and strings only, nothing unpickled beyond that.

The residuals are those of the allreduce path (``-s 0``). Through parameter servers the residuals
live in the KV store (worker and server side) and are not saved here: ``save`` refuses a
compressed optimizer on that path.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .backend import KV


def residuals(optimizer: Any) -> dict[str, torch.Tensor]:
    """This rank's error-feedback residuals by ``"<bucket>/<compressor>/<name>"`` (empty without
    trainer_core's compression)."""
    ex = optimizer._exchange
    if isinstance(ex.backend, KV) and ex.residual:
        raise ValueError(
            "checkpoints of a compressed optimizer on the parameter-server path are not supported "
            "(its residuals live in the KV store): use -s 0, or compression=Compression.none/fp16"
        )
    out: dict[str, torch.Tensor] = {}
    if ex.feedback is None:
        return out
    for key, st in ex.feedback.keys.items():
        for i, comp in enumerate([*st.workers, st.server]):
            for name, arr in comp.state_dict().items():
                out[f"{key}/{i}/{name}"] = torch.from_numpy(np.array(arr, copy=True))
    return out


def load_residuals(optimizer: Any, state: dict[str, torch.Tensor]) -> None:
    """Restore ``residuals()`` on this rank (the same buckets: the same model and options)."""
    ex = optimizer._exchange
    grouped: dict[int, dict[int, dict[str, np.ndarray]]] = {}
    for name, t in state.items():
        bucket, index, field = name.split("/")
        grouped.setdefault(int(bucket), {}).setdefault(int(index), {})[field] = t.numpy()
    if grouped and ex.feedback is None:
        raise ValueError("the checkpoint holds compression residuals, but this optimizer compresses nothing")
    for key, comps in grouped.items():
        st = ex.feedback.key(key, ex.backend.size)
        every = [*st.workers, st.server]
        if max(comps) >= len(every):
            raise ValueError(f"the checkpoint's residuals are of {max(comps)} workers, not {ex.backend.size}")
        for i, fields in comps.items():
            every[i].load_state_dict(fields)


def _rank_file(path: Path, epoch: int, rank: int) -> Path:
    return path.with_name(f"{path.name}.{epoch}.rank{rank}")


def _atomic(path: Path, write: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    write(tmp)
    os.replace(tmp, path)


def save(path: str | os.PathLike[str], epoch: int, model: torch.nn.Module, optimizer: Any, extra: dict[str, torch.Tensor] | None = None) -> None:  # fmt: skip
    """Collective: the checkpoint of ``epoch`` (see the module's text). ``extra``: tensors of the
    caller's own (a data loader's generator state) kept per rank."""
    p = Path(path)
    backend = optimizer._exchange.backend
    rank, size = backend.rank, backend.size
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "residuals": residuals(optimizer),
             "extra": dict(extra or {}), "epoch": epoch, "rank": rank, "size": size}  # fmt: skip
    _atomic(_rank_file(p, epoch, rank), lambda tmp: torch.save(state, tmp))
    backend.barrier()  # every rank's file of this epoch is in place
    if rank == 0:
        _atomic(p, lambda tmp: tmp.write_text(json.dumps({"epoch": epoch, "size": size})))
    backend.barrier()  # the checkpoint is this epoch's: older files may go
    for old in p.parent.glob(f"{p.name}.*.rank{rank}"):
        if old.name != _rank_file(p, epoch, rank).name:
            old.unlink(missing_ok=True)


def load(path: str | os.PathLike[str], model: torch.nn.Module, optimizer: Any) -> tuple[int, dict[str, torch.Tensor]] | None:  # fmt: skip
    """Restore this rank's state from the checkpoint at ``path``: ``(epoch, extra)``; None if
    there is none. A clear ``ValueError`` when it is of another job's shape or a file is missing."""
    p = Path(path)
    if not p.exists():
        return None
    backend = optimizer._exchange.backend
    try:
        head = json.loads(p.read_text())
        epoch, size = int(head["epoch"]), int(head["size"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{p}: not a checkpoint of trainer_core.torch ({e})") from None
    if size != backend.size:
        raise ValueError(f"{p}: a checkpoint of {size} workers, this job has {backend.size}")
    mine = _rank_file(p, epoch, backend.rank)
    if not mine.exists():
        raise ValueError(f"{mine}: worker {backend.rank}'s state of epoch {epoch} is missing")
    state = torch.load(mine, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    load_residuals(optimizer, state["residuals"])
    return int(state["epoch"]), dict(state["extra"])
