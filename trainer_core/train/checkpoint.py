"""Checkpoints: one ``.npz`` file of named arrays plus a small JSON manifest; never pickle.

>>> server = kv.server_state()                # every worker (collective); rank 0 gets the state
>>> save(path, params=model.params, learner=dl, residuals=kv.compression_state(),
...      server_state=server, step=s, epoch=e)  # rank 0
>>> save_worker(path, kv.rank, kv.compression_state(), step=s)  # every other worker
>>> ck = load(path)                          # every worker
>>> restore_params(model.params, ck)         # then build the distributed learner, then
>>> restore_learner(dl, ck); ck.epoch, ck.step
>>> restore_server(kv, ck)                   # every worker (collective), after init
>>> kv.load_compression_state(ck.residuals if kv.rank == 0 else load_worker(path, kv.rank, ck.step))

Without servers (``CollectiveCommunicator``, whose residuals differ per worker, as may the local
learner's state: model averaging keeps each worker's momentum):

>>> save_worker(path, comm.rank(), comm.compression_state(), step=s, learner=dl)  # ranks != 0
>>> comm.barrier(); save(path, ...) on rank 0; comm.barrier()
>>> mine = load_worker_state(path, rank, ck.step)  # ranks != 0, after restore_learner(dl, ck)
>>> restore_local_learner(dl, mine); comm.load_compression_state(mine.residuals)

What a checkpoint holds (array names inside the ``.npz``):

* ``param/<name>``: the parameters;
* ``local/<name>/<slot>``: the local learner's per-parameter state (velocities, Adam moments);
  its scalars (step count, Adam's ``t`` per parameter) go into the manifest;
* ``dist/<name>``: the distributed learner's own arrays (BMUF's previous model and block-level
  smoothed gradient), its scalars (samples seen, samples since the last sync) in the manifest;
* ``residual/<key>/<name>``: the gradient-compression residuals the caller passes (the worker's
  per-key error-feedback residuals, ``Compressor.state_dict()``);
* ``server/<i>/<slot>``: the servers' state of the ``i``-th key of the manifest's ``server`` list
  (``kv.server_state()``): ``value`` (the stored value), ``opt/<slot>`` (server optimizer arrays:
  momentum, Adam moments), ``pull/<part>/<slot>`` (the pull compressors' residuals); the scalars
  (Adam's ``opt/t``) and the keys themselves (ints stay ints) are in the manifest;
* ``manifest.json``: a uint8 array holding the UTF-8 JSON manifest: format and version, ``step``,
  ``epoch``, the local learner's name and scalars, the distributed learner's scalars, the
  compression params, ``server`` (the keys and scalars of the server state), ``extra`` (anything
  JSON the caller adds) and ``not_saved`` (a list of what the caller says this checkpoint cannot
  hold).

The other workers' own compression residuals go into one small file per worker next to the
checkpoint (``worker_path``: ``ck.npz`` -> ``ck.worker1.npz``), same format, written by that worker
(``save_worker``) with the step, so ``load_worker`` refuses a file of another step; given the
learner, it also holds that worker's local learner state (``local/...``). A worker file also keeps
the state of the step before (``previous/<key>/<name>`` residuals, ``previous_local/<name>/<slot>``,
``previous_step`` and ``previous_local`` in the manifest): the workers write theirs before rank 0
writes the checkpoint (the example's ``save_checkpoint``), so a job killed between the two resumes
from rank 0's older checkpoint.

Writing is atomic: a temporary file in the same directory, flushed and fsynced, then
``os.replace``; a reader sees the old checkpoint or the new one, never a torn file. Loading uses
``numpy.load(..., allow_pickle=False)``.
"""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from trainer_core.train.atomicfile import write_atomic
from trainer_core.xp import like, to_host

FORMAT = "trainer_core.train.checkpoint"
VERSION = 1
MANIFEST = "manifest.json"


@dataclass
class Checkpoint:
    """What ``load`` returns: arrays by group and the manifest's fields."""

    params: dict[str, np.ndarray]
    local: dict[str, dict[str, Any]]
    dist: dict[str, Any]
    residuals: dict[str, dict[str, np.ndarray]]
    server: dict[Any, dict[str, Any]] = field(default_factory=dict)
    step: int = 0
    epoch: int = 0
    learner_name: str = ""
    local_steps: int = 0
    compression: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    not_saved: list[str] = field(default_factory=list)
    # a worker file's residuals of the step before ``step`` (``save_worker`` keeps them), if any
    previous: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    previous_step: int | None = None
    # and its local learner state of that step (``previous_local/...``), if it holds one
    previous_local: dict[str, dict[str, Any]] = field(default_factory=dict)
    previous_local_steps: int = 0


def _is_scalar(value: Any) -> bool:
    return isinstance(value, bool | int | float | str) or value is None


def _split(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(arrays, JSON scalars) of a flat state dict."""
    arrays = {k: v for k, v in state.items() if not _is_scalar(v)}
    scalars = {k: v for k, v in state.items() if _is_scalar(v)}
    return arrays, scalars


def _local_learner(learner: Any) -> Any:
    """The local learner of a distributed learner, or ``learner`` itself."""
    return getattr(learner, "learner", learner)


def _local_state(
    state: dict[str, dict[str, Any]], name: str, steps: int, arrays: dict[str, np.ndarray], group: str
) -> dict[str, Any]:
    """Put a local learner's per-parameter arrays into ``arrays`` as ``<group>/<param>/<slot>``;
    its manifest entry (name, steps, the scalars)."""
    scalars: dict[str, dict[str, Any]] = {}
    for pname, slots in state.items():
        for slot, value in slots.items():
            if _is_scalar(value):
                scalars.setdefault(pname, {})[slot] = value
            else:
                arrays[f"{group}/{pname}/{slot}"] = to_host(value)
    return {"name": name, "steps": int(steps), "scalars": scalars}


def arrays_and_manifest(
    params: dict[str, Any],
    learner: Any = None,
    residuals: dict[str, dict[str, Any]] | None = None,
    step: int = 0,
    epoch: int = 0,
    compression: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    not_saved: list[str] | None = None,
    server_state: dict[Any, dict[str, Any]] | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The arrays and the manifest of a checkpoint (pure: no file is touched)."""
    if not isinstance(params, dict):  # a list was an AttributeError on 'items'
        raise TypeError(
            f"params: expected a dict of the arrays by parameter name, got {type(params).__name__}"
        )
    arrays: dict[str, np.ndarray] = {f"param/{k}": to_host(v) for k, v in params.items()}
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "step": int(step),
        "epoch": int(epoch),
        "compression": compression,
        "extra": extra or {},
        "not_saved": list(not_saved or []),
        "local": None,
        "dist": None,
        "server": None,
    }
    if learner is not None:
        local = _local_learner(learner)
        manifest["local"] = _local_state(local.state, local.name, local.steps, arrays, "local")
        if local is not learner:
            dist_arrays, dist_scalars = _split(learner.state_dict())
            arrays.update({f"dist/{k}": to_host(v) for k, v in dist_arrays.items()})
            manifest["dist"] = dist_scalars
    for key, state in (residuals or {}).items():
        for name, value in state.items():
            arrays[f"residual/{key}/{name}"] = to_host(value)
    if server_state is not None:
        keys: list[dict[str, Any]] = []
        for i, (key, state) in enumerate(server_state.items()):
            slot_arrays, slot_scalars = _split(state)
            arrays.update({f"server/{i}/{slot}": to_host(v) for slot, v in slot_arrays.items()})
            keys.append({"key": key, "scalars": slot_scalars})
        manifest["server"] = keys
    return arrays, manifest


def save(path: str | os.PathLike[str], **kwargs: Any) -> Path:
    """Write a checkpoint atomically (see ``arrays_and_manifest`` for the arguments)."""
    arrays, manifest = arrays_and_manifest(**kwargs)
    return write(path, arrays, manifest)


def write(path: str | os.PathLike[str], arrays: dict[str, np.ndarray], manifest: dict[str, Any]) -> Path:
    """Write ``arrays`` and ``manifest`` to ``path`` through a temporary file and a rename."""
    target = Path(path)
    if target.suffix != ".npz":
        raise ValueError(f"checkpoint paths end in .npz, got {target}")
    if MANIFEST in arrays:
        raise ValueError(f"{MANIFEST!r} is reserved")
    blob = np.frombuffer(json.dumps(manifest, sort_keys=True).encode("utf-8"), dtype=np.uint8)

    def savez(f: BinaryIO) -> None:
        payload: dict[str, Any] = {MANIFEST: blob}
        payload.update((k, np.ascontiguousarray(v)) for k, v in arrays.items())
        save_arrays: Any = np.savez  # numpy's stub types the keyword arrays as its own options
        save_arrays(f, **payload)

    write_atomic(target, savez)
    return target


def load(path: str | os.PathLike[str]) -> Checkpoint:
    """Read a checkpoint written by ``save`` (``allow_pickle=False``)."""
    if Path(path).is_file() and not zipfile.is_zipfile(path):  # numpy would call it pickled data
        raise ValueError(f"{path}: not a trainer_core checkpoint (not an .npz archive, as save writes)")
    with np.load(Path(path), allow_pickle=False) as z:
        data = {k: z[k] for k in z.files}
    if MANIFEST not in data:
        raise ValueError(f"{path}: not a trainer_core checkpoint (no {MANIFEST})")
    manifest = json.loads(bytes(data.pop(MANIFEST)).decode("utf-8"))
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise ValueError(
            f"{path}: unsupported checkpoint format {manifest.get('format')!r} "
            f"version {manifest.get('version')!r}"
        )
    ck = Checkpoint(params={}, local={}, dist=dict(manifest.get("dist") or {}), residuals={})
    server_arrays: dict[int, dict[str, np.ndarray]] = {}
    for name, arr in data.items():
        group, _, rest = name.partition("/")
        if group == "param":
            ck.params[rest] = arr
        elif group in ("local", "previous_local"):
            pname, _, slot = rest.rpartition("/")
            (ck.local if group == "local" else ck.previous_local).setdefault(pname, {})[slot] = arr
        elif group == "dist":
            ck.dist[rest] = arr
        elif group in ("residual", "previous"):
            key, _, slot = rest.rpartition("/")
            (ck.residuals if group == "residual" else ck.previous).setdefault(key, {})[slot] = arr
        elif group == "server":
            index, _, slot = rest.partition("/")
            server_arrays.setdefault(int(index), {})[slot] = arr
    local = manifest.get("local") or {}
    for pname, scalars in (local.get("scalars") or {}).items():
        ck.local.setdefault(pname, {}).update(scalars)
    ck.learner_name, ck.local_steps = local.get("name", ""), int(local.get("steps", 0))
    ck.step, ck.epoch = int(manifest["step"]), int(manifest["epoch"])
    ck.compression, ck.extra = manifest.get("compression"), manifest.get("extra") or {}
    ck.not_saved = list(manifest.get("not_saved") or [])
    if manifest.get("previous_step") is not None:
        ck.previous_step = int(manifest["previous_step"])
    previous_local = manifest.get("previous_local") or {}
    for pname, scalars in (previous_local.get("scalars") or {}).items():
        ck.previous_local.setdefault(pname, {}).update(scalars)
    ck.previous_local_steps = int(previous_local.get("steps", 0))
    for i, entry in enumerate(manifest.get("server") or []):
        ck.server[entry["key"]] = {**server_arrays.pop(i, {}), **(entry.get("scalars") or {})}
    if server_arrays:
        raise ValueError(f"{path}: server state arrays without a key in the manifest")
    return ck


def restore_params(params: dict[str, Any], ck: Checkpoint) -> None:
    """Copy the checkpoint's parameters into ``params`` (in place, onto each array's device)."""
    missing = set(params) ^ set(ck.params)
    if missing:
        raise ValueError(f"checkpoint and model disagree on parameters {sorted(missing)}")
    for k, p in params.items():
        if p.shape != ck.params[k].shape:
            raise ValueError(f"parameter {k!r}: checkpoint shape {ck.params[k].shape}, model {p.shape}")
        p[...] = like(ck.params[k], p)


def restore_learner(learner: Any, ck: Checkpoint) -> None:
    """Restore the local learner's state and, for a distributed learner, its own state."""
    restore_local_learner(learner, ck)
    local = _local_learner(learner)
    if local is not learner:
        learner.load_state_dict(ck.dist)


def restore_local_learner(learner: Any, ck: Checkpoint) -> None:
    """Restore only the local learner's state (of ``learner``, or of the distributed learner it is):
    e.g. from a worker's own file (``load_worker_state``), after ``restore_learner``."""
    local = _local_learner(learner)
    if ck.learner_name and ck.learner_name != local.name:
        raise ValueError(f"checkpoint holds a {ck.learner_name!r} learner, not {local.name!r}")
    state = {}
    for pname, slots in ck.local.items():
        if pname not in local.params:
            raise ValueError(f"checkpoint holds learner state for {pname!r}, which is not a parameter")
        ref = local.params[pname]
        state[pname] = {s: (v if _is_scalar(v) else like(v.copy(), ref)) for s, v in slots.items()}
    local.load_state(state)
    local.steps = ck.local_steps


def restore_server(kv: Any, ck: Checkpoint) -> None:
    """Restore the servers' state (``kv.load_server_state``; collective: every worker calls it at the
    same point, after ``set_optimizer``, ``set_gradient_compression`` and ``init``)."""
    kv.load_server_state(ck.server)


def worker_path(path: str | os.PathLike[str], rank: int) -> Path:
    """The file of worker ``rank``'s own state next to checkpoint ``path`` (``ck.npz`` -> ``ck.worker1.npz``)."""
    target = Path(path)
    return target.with_name(f"{target.stem}.worker{int(rank)}.npz")


def save_worker(
    path: str | os.PathLike[str],
    rank: int,
    residuals: dict[str, dict[str, Any]],
    step: int = 0,
    learner: Any = None,
) -> Path:
    """Write worker ``rank``'s compression residuals (``kv.compression_state()``) and, given
    ``learner``, its local learner's state atomically into ``worker_path(path, rank)``; each worker
    writes its own (they differ per worker). The state of the file it replaces stays in it as the
    previous step's: a job killed after this worker wrote step N but before rank 0's checkpoint of
    step N resumes from step N - 1 with this file."""
    local = None if learner is None else _local_learner(learner)
    arrays, manifest = arrays_and_manifest(params={}, learner=local, residuals=residuals, step=step)
    manifest["extra"] = {"rank": int(rank)}
    before = _readable(worker_path(path, rank))
    if before is not None and before.extra.get("rank") == int(rank):
        kept = (before.residuals, before.local, before.local_steps, before.learner_name)
        kept_step: int | None = before.step
        if before.step == step:  # the same step again (a resumed run repeating it): keep the one before
            kept = (before.previous, before.previous_local, before.previous_local_steps, before.learner_name)
            kept_step = before.previous_step
        if kept_step is not None:
            residual_kept, local_kept, steps_kept, name_kept = kept
            arrays.update(
                (f"previous/{key}/{slot}", to_host(v))
                for key, slots in residual_kept.items()
                for slot, v in slots.items()
            )
            manifest["previous_step"] = kept_step
            if local_kept:
                manifest["previous_local"] = _local_state(
                    local_kept, name_kept, steps_kept, arrays, "previous_local"
                )
    return write(worker_path(path, rank), arrays, manifest)


def _readable(path: Path) -> Checkpoint | None:
    """The checkpoint in ``path``, or None when there is none or it cannot be read."""
    try:
        return load(path)
    except (OSError, ValueError, KeyError):
        return None


def load_worker(
    path: str | os.PathLike[str], rank: int, step: int | None = None
) -> dict[str, dict[str, np.ndarray]]:
    """Worker ``rank``'s residuals saved next to checkpoint ``path`` (with ``step``: of that step,
    the file's latest or the previous one it keeps); ``ValueError`` when the file is another
    worker's or holds no residuals of ``step``."""
    return load_worker_state(path, rank, step).residuals


def load_worker_state(path: str | os.PathLike[str], rank: int, step: int | None = None) -> Checkpoint:
    """Worker ``rank``'s own state saved next to checkpoint ``path`` (``residuals``, and ``local``
    with ``learner_name`` and ``local_steps`` when the learner was saved), of ``step`` as
    ``load_worker``; ``ValueError`` when there is no such file or it holds no state of ``step``."""
    target = worker_path(path, rank)
    if not target.exists():
        raise ValueError(f"{target}: worker {rank}'s state of checkpoint {path} is missing")
    ck = load(target)
    if ck.extra.get("rank") != int(rank):
        raise ValueError(f"{target} holds worker {ck.extra.get('rank')!r}'s state")
    if step is None or ck.step == step:
        return ck
    if ck.previous_step == step:
        return Checkpoint(
            params={},
            local=ck.previous_local,
            dist={},
            residuals=ck.previous,
            step=step,
            learner_name=ck.learner_name,
            local_steps=ck.previous_local_steps,
            extra=ck.extra,
        )
    held = f"steps {ck.previous_step} and {ck.step}" if ck.previous_step is not None else f"step {ck.step}"
    raise ValueError(f"{worker_path(path, rank)} is of {held}, the checkpoint of step {step}")
