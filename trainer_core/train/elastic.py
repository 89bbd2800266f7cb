"""The learners in an elastic job (``launchkit launch -n MIN:MAX``): a training loop that goes on
when workers leave or join, on the workers' collective group (no servers), as ``hvd.elastic``
does for torch (docs/elastic.md).

>>> state = LearnerState(epoch=0, processed=0)
>>> def train(group):
...     comm = CollectiveCommunicator(group)           # the group of this epoch
...     learner = make_learner(comm)                     # built again at every change
...     state.sync(comm, learner)                        # rank 0's last commit, on every rank
...     while state.values["epoch"] < epochs:
...         ...                                          # a step: learner.update(...)
...         state.values["processed"] += ...
...         state.commit(learner)
...     return comm
>>> comm = run(train, collective.join())

``run`` calls ``train(group)`` until it returns. When an operation of the group fails because the
workers changed (``MembershipChanged``: a worker left, or one joined and the survivors' next
operation noticed it), every survivor joins the group of the new epoch (the collectives'
``reform``, again while the workers change meanwhile) and calls ``train`` with it; a worker that
joined later meets them in its ``join()`` and calls ``train`` as the first workers did.

``LearnerState`` is what a change goes back to, kept in the worker's memory: at ``commit`` a copy
of the parameters, the local learner's state (momentum, moments, its step count), the distributed
learner's own state (``state_dict``: samples seen, a block's start and momentum) and plain values
(the epoch, how far it got). ``sync`` sends rank 0's last commit to every rank (a survivor keeps
its rank order, so rank 0 is a survivor and its commit is the job's) and loads it into the new
learner: whatever a step did after the last commit is done again by the new group, so no step is
counted twice. Arrays travel as themselves (``Communicator.broadcast``), their names, shapes and
the plain values as one JSON document, never pickled. What is not kept: a compressed exchange's
error feedback (each worker's residuals belong to the old group's chunks: they start again at
zero).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from trainer_core.collective import CollectiveClosed, LinkError
from trainer_core.collective import job as collective_job
from trainer_core.errors import MembershipChanged
from trainer_core.xp import array_module

from .collcomm import CollectiveCommunicator

#: what an operation of a group raises when the workers changed under it
GROUP_FAILURES = (MembershipChanged, LinkError, CollectiveClosed)

T = TypeVar("T")


@dataclass
class Commit:
    """One saved state: plain values and named arrays (``param/NAME``, ``local/NAME/SLOT``,
    ``dist/NAME``) plus the scalars among the learners' state."""

    values: dict[str, Any]
    arrays: dict[str, Any] = field(default_factory=dict)
    scalars: dict[str, Any] = field(default_factory=dict)


def _scalar(value: Any) -> Any:
    """A plain JSON value for a learner's scalar (``numpy`` scalars included), else None."""
    if isinstance(value, np.generic):
        value = value.item()
    return value if isinstance(value, (bool, int, float)) else None


def snapshot(learner: Any, values: dict[str, Any]) -> Commit:
    """A copy of ``learner``'s state (a distributed learner of ``train.learners``) and ``values``."""
    out = Commit(copy.deepcopy(values))
    for name, p in learner.params.items():
        out.arrays[f"param/{name}"] = p.copy()
    local = learner.learner
    out.scalars["local_steps"] = int(local.steps)
    for name, slots in local.state.items():
        for slot, v in slots.items():
            kept = _scalar(v)
            if kept is None:
                out.arrays[f"local/{name}/{slot}"] = v.copy()
            else:
                out.scalars[f"local/{name}/{slot}"] = kept
    for name, v in learner.state_dict().items():
        kept = _scalar(v)
        if kept is None:
            out.arrays[f"dist/{name}"] = v.copy()
        else:
            out.scalars[f"dist/{name}"] = kept
    return out


def load(learner: Any, commit: Commit) -> None:
    """Put ``commit`` into ``learner``: its parameters in place, the local learner's state and
    step count, then the distributed learner's own state (which may start its distributed phase:
    collective, and every rank loads the same commit)."""
    for name, p in learner.params.items():
        p[...] = commit.arrays[f"param/{name}"]
    per: dict[str, dict[str, Any]] = {}
    dist: dict[str, Any] = {}
    for key, v in [*commit.arrays.items(), *commit.scalars.items()]:
        kind, _, rest = key.partition("/")
        if kind == "local":
            name, _, slot = rest.rpartition("/")
            per.setdefault(name, {})[slot] = v
        elif kind == "dist":
            dist[rest] = v
    local = learner.learner
    local.load_state(per)
    local.steps = int(commit.scalars["local_steps"])
    learner.load_state_dict(dist)


def broadcast_commit(comm: CollectiveCommunicator, mine: Commit | None, like: Any) -> Commit:
    """Rank 0's ``mine`` on every rank: one JSON document (values, scalars, each array's name,
    shape and dtype; its length first), then the arrays themselves; ``like``: an array of this
    rank's parameters (where a receiver makes its arrays: numpy or cupy)."""
    root = comm.rank() == 0
    if root:
        assert mine is not None, "rank 0 broadcasts its last commit: commit first"
        shapes = [[k, list(a.shape), str(a.dtype)] for k, a in mine.arrays.items()]
        text = json.dumps({"values": mine.values, "scalars": mine.scalars, "arrays": shapes}).encode()
        doc = np.frombuffer(text, np.uint8).copy()
        n = np.array([doc.size], np.int64)
    else:
        n = np.zeros(1, np.int64)
    comm.broadcast(["__elastic__/length"], [n])
    if not root:
        doc = np.zeros(int(n[0]), np.uint8)
    comm.broadcast(["__elastic__/state"], [doc])
    got = json.loads(doc.tobytes())
    xp = array_module(like)
    arrays = (
        mine.arrays
        if root and mine is not None
        else {k: xp.zeros(tuple(shape), dtype=dtype) for k, shape, dtype in got["arrays"]}
    )
    if arrays:
        comm.broadcast([f"__elastic__/{k}" for k in arrays], list(arrays.values()))
    return Commit(got["values"], dict(arrays), got["scalars"])


class LearnerState:
    """What a change of the workers goes back to (see the module's text); ``values``: plain
    values (numbers, text, lists, dicts) the loop keeps, such as the epoch and its position."""

    def __init__(self, **values: Any) -> None:
        self.values: dict[str, Any] = dict(values)
        self.committed: Commit | None = None

    def commit(self, learner: Any) -> None:
        """Save the state: the point a change of the workers goes back to."""
        self.committed = snapshot(learner, self.values)

    def sync(self, comm: CollectiveCommunicator, learner: Any) -> None:
        """Collective, after the learner was built on ``comm``: every rank takes rank 0's last
        commit (a rank that never committed commits first: the state it starts from) into
        ``learner`` and ``values``, and commits it."""
        if self.committed is None:
            self.commit(learner)
        like = next(iter(learner.params.values()))
        got = broadcast_commit(comm, self.committed, like)
        load(learner, got)
        self.values = copy.deepcopy(got.values)
        self.commit(learner)


def rejoin(group: Any, reform: Callable[[Any], Any] = collective_job.reform) -> Any:
    """The group of the job's new epoch after ``group`` failed (``reform``), again while the
    workers change meanwhile."""
    while True:
        try:
            return reform(group)
        except MembershipChanged:
            continue


def run(train: Callable[[Any], T], group: Any, reform: Callable[[Any], Any] = collective_job.reform) -> T:
    """``train(group)`` until it returns; after a failure of the group because the workers
    changed (``GROUP_FAILURES``), ``train`` again with the group of the new epoch. For an
    elastic job's group (``collective.join()`` with ``LAUNCHKIT_ELASTIC``): in a fixed job a
    lost worker ends the job, and there is no new epoch to go to."""
    while True:
        try:
            return train(group)
        except GROUP_FAILURES:
            group = rejoin(group, reform)
