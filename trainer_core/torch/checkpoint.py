"""Checkpoints of a ``DistributedOptimizer``'s training: the model's and the optimizer's state
dicts with trainer_core's own state, so that a resumed job continues exactly where an unbroken one
would be. trainer_core's state is every rank's error-feedback residuals (the allreduce path's, or
on the parameter-server path the KV store's worker-side ones) and, through parameter servers, the
servers' state of the optimizer's keys: the stored values (the weights, with a server-side
optimizer), the server optimizer's state (momentum, Adam's moments and step) and the servers' pull
residuals (``kv.server_state()``, docs/kvstore.md).

``save(path, epoch, model, optimizer, extra)`` is collective (every worker calls it at the same
point, between steps). Every rank writes its own file, ``<path>.<epoch>.rank<r>`` (its residuals
differ from the others'); through servers rank 0 also writes ``<path>.<epoch>.server``, once.
Each file is written to a temporary name and renamed (atomic). After a barrier rank 0 writes the
manifest, ``<path>`` (JSON: the epoch, the worker and server counts, the files), again through a
rename: the checkpoint is that epoch's from then on, and never one whose files are not all
complete. After a second barrier every rank removes its files of older epochs (and temporary ones
a killed save left). A job killed at any point resumes from the epoch the manifest names, whose
files are all there.

``load(path, model, optimizer)`` (every rank, after ``DistributedOptimizer`` is made) restores
them and returns ``(epoch, extra)``, or None when there is no checkpoint yet; through servers it
is collective too (the servers' state is sent by rank 0). Every rank checks the manifest and that
every file it names exists before anything is loaded, so a bad checkpoint fails every rank alike.
Files are read with ``torch.load(weights_only=True)``: tensors, numbers and strings only, nothing
unpickled beyond that.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer_core.errors import KVError
from trainer_core.train.atomicfile import write_atomic
from trainer_core.xp import to_host

from .backend import KV

#: the manifest's format (1: ``{"epoch", "size"}`` of a ``-s 0`` job, still read)
FORMAT = 2


# -- trainer_core's state ---------------------------------------------------------------------------


def residuals(optimizer: Any) -> dict[str, torch.Tensor]:
    """This rank's error-feedback residuals (empty without trainer_core's compression): on the
    allreduce path ``"<bucket>/<compressor>/<name>"``; through servers the KV store's, of this
    optimizer's keys, ``"kv/<bucket>/<part>/<name>"``."""
    ex = optimizer._exchange
    out: dict[str, torch.Tensor] = {}
    if isinstance(ex.backend, KV):
        if not ex.residual:
            return out
        bucket_of = {key: b for b, key in enumerate(ex.keys)}
        state = ex.backend.submit("compression_state", ex.backend.kv.compression_state).wait()
        for name, fields in state.items():
            key, _, part = name.rpartition("/")
            if key in bucket_of:
                for field, arr in fields.items():
                    out[f"kv/{bucket_of[key]}/{part}/{field}"] = _tensor(arr)
        return out
    if ex.feedback is None:
        return out
    for key, st in ex.feedback.keys.items():
        for i, comp in enumerate([*st.workers, st.server]):
            for name, arr in comp.state_dict().items():
                out[f"{key}/{i}/{name}"] = _tensor(arr)
    return out


def load_residuals(optimizer: Any, state: dict[str, torch.Tensor]) -> None:
    """Restore ``residuals()`` on this rank (the same buckets: the same model and options)."""
    ex = optimizer._exchange
    ps = isinstance(ex.backend, KV)
    if any(n.startswith("kv/") != ps for n in state):
        held, runs = ("allreduce", "parameter-server") if ps else ("parameter-server", "allreduce")
        raise ValueError(
            f"the checkpoint holds residuals of the {held} path, and this job runs on the {runs} path"
        )
    if state and not ex.residual:
        raise ValueError("the checkpoint holds compression residuals, but this optimizer compresses nothing")
    if ps:
        _load_kv_residuals(ex, state)
        return
    grouped: dict[int, dict[int, dict[str, np.ndarray]]] = {}
    for name, t in state.items():
        bucket, index, field = name.split("/")
        grouped.setdefault(int(bucket), {}).setdefault(int(index), {})[field] = t.numpy()
    for key, comps in grouped.items():
        st = ex.feedback.key(key, ex.backend.size)
        every = [*st.workers, st.server]
        if max(comps) >= len(every):
            raise ValueError(f"the checkpoint's residuals are of {max(comps)} workers, not {ex.backend.size}")
        for i, fields in comps.items():
            every[i].load_state_dict(fields)


def _load_kv_residuals(ex: Any, state: dict[str, torch.Tensor]) -> None:
    grouped: dict[str, dict[str, np.ndarray]] = {}
    for name, t in state.items():
        _, bucket, part, field = name.split("/", 3)
        key = f"{ex.keys[_bucket(bucket, len(ex.keys))]}/{part}"
        grouped.setdefault(key, {})[field] = t.numpy()
    if grouped:
        kv = ex.backend.kv
        ex.backend.submit("load_compression_state", lambda: kv.load_compression_state(grouped)).wait()


def server_state(optimizer: Any) -> dict[str, Any]:
    """Collective through servers: the servers' state of this optimizer's keys by
    ``"<bucket>/<slot>"`` (``value``, ``opt/<slot>``, ``pull/<part>/<slot>``: tensors, and ints
    such as Adam's ``opt/t``) on rank 0, ``{}`` on the others."""
    ex = optimizer._exchange
    state = ex.backend.submit("server_state", ex.backend.kv.server_state).wait()
    out: dict[str, Any] = {}
    for b, key in enumerate(ex.keys):
        for slot, value in state.get(key, {}).items():
            out[f"{b}/{slot}"] = _tensor(value) if isinstance(value, np.ndarray) else value
    return out


def load_server_state(optimizer: Any, state: dict[str, Any], where: Path) -> None:
    """Collective through servers: rank 0's ``state`` (``server_state()``'s) put back on the
    servers; the others' is ignored. ``where``: the file it came from, for errors."""
    ex = optimizer._exchange
    by_key: dict[str, dict[str, Any]] = {}
    for name, value in state.items():
        bucket, _, slot = name.partition("/")
        key = ex.keys[_bucket(bucket, len(ex.keys), where)]
        by_key.setdefault(key, {})[slot] = value.numpy() if isinstance(value, torch.Tensor) else value
    kv = ex.backend.kv
    try:
        ex.backend.submit("load_server_state", lambda: kv.load_server_state(by_key)).wait()
    except KVError as e:
        raise ValueError(f"{where}: the servers' state does not fit this optimizer ({e})") from None


def _tensor(arr: Any) -> torch.Tensor:
    return torch.from_numpy(np.array(to_host(arr), copy=True))


def _bucket(text: str, count: int, where: Path | None = None) -> int:
    if not text.isdigit() or int(text) >= count:
        at = f"{where}: " if where is not None else ""
        raise ValueError(
            f"{at}the checkpoint has state of bucket {text}, this optimizer has {count} buckets (another model or fusion_threshold?)"
        )
    return int(text)


# -- files ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Manifest:
    """What ``<path>`` says: the epoch, the worker and server counts and the checkpoint's files."""

    epoch: int
    size: int
    servers: int
    files: tuple[str, ...]

    def text(self) -> str:
        body = {"format": FORMAT, "epoch": self.epoch, "size": self.size, "servers": self.servers}
        return json.dumps({**body, "files": list(self.files)})


def files_of(path: Path, epoch: int, size: int, servers: int) -> tuple[str, ...]:
    """The names of a checkpoint's files beside ``path``: one per rank, and the servers' one."""
    ranks = [_rank_file(path, epoch, r).name for r in range(size)]
    return tuple(ranks + ([_server_file(path, epoch).name] if servers else []))


def parse_manifest(path: Path, text: str) -> Manifest:
    """The manifest in ``text`` (``path``'s); a ``ValueError`` naming what is wrong."""
    try:
        head = json.loads(text)
        fmt = int(head.get("format", 1))
        epoch, size, servers = int(head["epoch"]), int(head["size"]), int(head.get("servers", 0))
        files = tuple(str(f) for f in head.get("files", files_of(path, epoch, size, 0)))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(
            f"{path}: not a checkpoint of trainer_core.torch ({type(e).__name__}: {e})"
        ) from None
    if fmt > FORMAT:
        raise ValueError(f"{path}: a checkpoint of format {fmt}, newer than this trainer_core's ({FORMAT})")
    if epoch < 0 or size < 1 or servers < 0 or files != files_of(path, epoch, size, servers):
        raise ValueError(
            f"{path}: not a checkpoint of trainer_core.torch (its epoch, counts and files disagree)"
        )
    return Manifest(epoch, size, servers, files)


def _rank_file(path: Path, epoch: int, rank: int) -> Path:
    return path.with_name(f"{path.name}.{epoch}.rank{rank}")


def _server_file(path: Path, epoch: int) -> Path:
    return path.with_name(f"{path.name}.{epoch}.server")


def _atomic(path: Path, write: Any) -> None:
    """``write(file)`` to ``path`` through ``.<name>.tmp<pid>`` (``train.atomicfile.write_atomic``:
    the directory made if missing, a failed write's error never hidden by the cleanup's)."""
    write_atomic(path, write, tmp=path.with_name(f".{path.name}.tmp{os.getpid()}"))


def _read(path: Path, *fields: str) -> dict[str, Any]:
    """A checkpoint file's contents (``torch.load(weights_only=True)``); a ``ValueError`` naming the
    file when it cannot be read or lacks one of ``fields``."""
    try:
        got = torch.load(path, weights_only=True)
    except Exception as e:  # torch raises pickle's, EOF, zip and runtime errors for a bad file
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"{path}: not a checkpoint file of trainer_core.torch ({reason})") from None
    missing = [f for f in fields if not isinstance(got, dict) or f not in got]
    if missing:
        raise ValueError(f"{path}: not a checkpoint file of trainer_core.torch (no {', '.join(missing)})")
    return got


def _servers(optimizer: Any) -> int:
    backend = optimizer._exchange.backend
    return int(backend.kv.num_servers) if isinstance(backend, KV) else 0


# -- save and load ----------------------------------------------------------------------------------


def save(
    path: str | os.PathLike[str],
    epoch: int,
    model: torch.nn.Module,
    optimizer: Any,
    extra: dict[str, torch.Tensor] | None = None,
) -> None:
    """Collective: the checkpoint of ``epoch`` (see the module's text). ``extra``: tensors of the
    caller's own (a data loader's generator state) kept per rank."""
    p = Path(path)
    backend = optimizer._exchange.backend
    rank, size, servers = backend.rank, backend.size, _servers(optimizer)
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "residuals": residuals(optimizer),
        "extra": dict(extra or {}),
        "epoch": epoch,
        "rank": rank,
        "size": size,
    }
    held = server_state(optimizer) if servers else {}  # collective: the servers' state on rank 0
    _atomic(_rank_file(p, epoch, rank), lambda f: torch.save(state, f))
    if servers and rank == 0:
        _atomic(_server_file(p, epoch), lambda f: torch.save({"servers": servers, "state": held}, f))
    backend.barrier()  # every file of this epoch is in place
    if rank == 0:  # the manifest last: from now on the checkpoint is this epoch's
        text = Manifest(epoch, size, servers, files_of(p, epoch, size, servers)).text()
        _atomic(p, lambda f: f.write(text.encode("utf-8")))
    backend.barrier()  # older files may go
    keep = {_rank_file(p, epoch, rank).name, _server_file(p, epoch).name}
    d, name = p.parent, p.name  # older epochs' files, and the temporary ones of a killed save
    olds = [*d.glob(f"{name}.*.rank{rank}"), *d.glob(f".{name}.*.rank{rank}.tmp*")]
    if rank == 0:
        olds += [*d.glob(f"{name}.*.server"), *d.glob(f".{name}.*.server.tmp*"), *d.glob(f".{name}.tmp*")]
    for old in olds:
        if old.name not in keep:
            old.unlink(missing_ok=True)


def load(
    path: str | os.PathLike[str], model: torch.nn.Module, optimizer: Any
) -> tuple[int, dict[str, torch.Tensor]] | None:
    """Restore this rank's state from the checkpoint at ``path``: ``(epoch, extra)``; None if
    there is none. A clear ``ValueError`` when it is of another job's shape or a file is missing
    (on every rank alike, before anything is loaded)."""
    p = Path(path)
    if not p.exists():
        return None
    backend = optimizer._exchange.backend
    head = parse_manifest(p, p.read_text())
    if head.size != backend.size:
        raise ValueError(f"{p}: a checkpoint of {head.size} workers, this job has {backend.size}")
    servers = _servers(optimizer)
    if head.servers != servers:
        raise ValueError(
            f"{p}: a checkpoint of a job with {head.servers} servers, this job has {servers} (a checkpoint resumes on the same path: -s {head.servers})"
        )
    for name in head.files:
        if not (p.parent / name).exists():
            whose = "the servers'" if name.endswith(".server") else f"worker {name.rpartition('.rank')[2]}'s"
            raise ValueError(f"{p.parent / name}: {whose} state of epoch {head.epoch} is missing")
    state = _read(
        _rank_file(p, head.epoch, backend.rank), "model", "optimizer", "residuals", "extra", "epoch"
    )
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    load_residuals(optimizer, state["residuals"])
    if servers:
        where = _server_file(p, head.epoch)
        held = _read(where, "state")["state"] if backend.rank == 0 else {}
        load_server_state(optimizer, held, where)
    return int(state["epoch"]), dict(state["extra"])
