"""Horovod's elastic API (``hvd.elastic``): a training function that survives a change of the job's
workers (docs/elastic.md).

>>> state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
>>> @hvd.elastic.run
... def train(state):
...     for state.epoch in range(state.epoch, epochs):
...         ...  # steps; every few: state.commit()
>>> train(state)

``run`` calls the function with ``state`` synced from rank 0. When a collective fails because the
group did (a worker lost: ``HorovodInternalError``), the state goes back to its last ``commit()``;
when workers were added (``HostsUpdatedInterrupt``, raised by ``commit()`` on every rank at once),
it keeps its values. Either way the worker joins the group of the job's new epoch (the collectives'
``reform``: dense ranks again, the same process, as Horovod's reset), the reset callbacks run, the
state is synced from the new rank 0, and the function is called again.

A state saves in memory, on the worker itself: ``commit()`` is ``save()`` plus the check for added
workers. ``TorchState`` handles a model (its ``state_dict``), an optimizer (its ``state_dict``;
synced with ``broadcast_optimizer_state``), ``ElasticSampler``s (how far the epoch got) and any
other value that ``broadcast_object`` carries.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch

from trainer_core.errors import MembershipChanged

from .elastic_sampler import ElasticSampler
from .ops import GROUP_FAILURES, HorovodInternalError
from .runtime import Runtime, default
from .state import broadcast_object, broadcast_optimizer_state, broadcast_parameters

__all__ = ["ElasticSampler", "HostsUpdatedInterrupt", "ObjectState", "State", "TorchState", "run"]


class HostsUpdatedInterrupt(RuntimeError):
    """Workers were added: raised by ``State.commit()`` on every rank at the same commit, so that
    ``run`` brings them in. ``skip_sync``: the state need not be synced again (Horovod's)."""

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("workers were added to the job: the group re-forms with them")
        self.skip_sync = skip_sync


class State:
    """What ``run`` saves, restores and syncs; subclasses say how (``save``, ``restore``, ``sync``)."""

    def __init__(self, runtime: Runtime | None = None) -> None:
        self._runtime = runtime or default
        self._reset_callbacks: list[Callable[[], None]] = []

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], None]]) -> None:
        """Functions to call after each change of the workers (to rescale a learning rate, say)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Save the state (the point a failure goes back to), then raise ``HostsUpdatedInterrupt``
        on every rank if workers are waiting to join."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        backend = self._runtime.backend()
        waiting = getattr(backend, "workers_waiting", None)
        mine = bool(waiting()) if callable(waiting) else False
        if broadcast_object(mine, 0, runtime=self._runtime):  # rank 0's view decides for every rank
            raise HostsUpdatedInterrupt(skip_sync=False)

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """Called after the group re-formed, before the callbacks (the new size is known)."""


class ObjectState(State):
    """Plain values (``epoch=0, batch=0``) as attributes; synced with ``broadcast_object``."""

    def __init__(self, runtime: Runtime | None = None, **values: Any) -> None:
        super().__init__(runtime)
        self._names = list(values)
        self.__dict__.update(values)
        self._saved = self._values()

    def _values(self) -> dict[str, Any]:
        return {name: copy.deepcopy(getattr(self, name)) for name in self._names}

    def save(self) -> None:
        self._saved = self._values()

    def restore(self) -> None:
        self.__dict__.update(copy.deepcopy(self._saved))

    def sync(self) -> None:
        if self._names:
            self.__dict__.update(broadcast_object(self._values(), 0, runtime=self._runtime))
            self.save()


class TorchState(ObjectState):
    """A model, an optimizer, samplers and plain values (Horovod's ``TorchState``)."""

    def __init__(
        self,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        runtime: Runtime | None = None,
        **values: Any,
    ) -> None:
        self.model, self.optimizer = model, optimizer
        self._samplers = {k: v for k, v in values.items() if isinstance(v, ElasticSampler)}
        for k, v in self._samplers.items():
            setattr(self, k, v)
        plain = {k: v for k, v in values.items() if k not in self._samplers}
        super().__init__(runtime, **plain)

    def save(self) -> None:
        super().save()
        self._model_saved = copy.deepcopy(self.model.state_dict()) if self.model is not None else None
        self._opt_saved = copy.deepcopy(self.optimizer.state_dict()) if self.optimizer is not None else None
        self._samplers_saved = {k: s.state_dict() for k, s in self._samplers.items()}

    def restore(self) -> None:
        super().restore()
        if self.model is not None and self._model_saved is not None:
            self.model.load_state_dict(self._model_saved)
        if self.optimizer is not None and self._opt_saved is not None:
            self.optimizer.load_state_dict(self._opt_saved)
        for k, s in self._samplers.items():
            s.load_state_dict(self._samplers_saved[k])

    def sync(self) -> None:
        rt = self._runtime
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), 0, runtime=rt)
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, 0, runtime=rt)
        for s in self._samplers.values():  # (every worker counted the same steps: rank 0's count)
            s.load_state_dict(broadcast_object(s.state_dict(), 0, runtime=rt))
        super().sync()

    def reset(self) -> None:
        rebind = getattr(self.optimizer, "_rebind", None)
        if callable(rebind):  # a DistributedOptimizer: its buckets over the new group
            rebind(self._runtime.backend())
        for s in self._samplers.values():
            s.reset()


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Horovod's ``hvd.elastic.run``: call ``func(state, ...)`` until it returns, across changes of
    the workers (see the module's text)."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        reset, skip_sync = False, False
        while True:
            if reset:
                _rejoin(state._runtime)
                state.on_reset()
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except (HorovodInternalError, *GROUP_FAILURES):
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as e:
                skip_sync = e.skip_sync
            reset = True

    return wrapper


def _rejoin(runtime: Runtime) -> None:
    """Join the group of the job's new epoch (Horovod's reset; the worker stays in the job), again
    while the workers change meanwhile."""
    while True:
        try:
            runtime.reform()
            return
        except MembershipChanged:
            continue
