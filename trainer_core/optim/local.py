"""Local learners: SGD, momentum SGD, Nesterov and Adam, on dicts of parameter arrays.

A ``Learner`` holds the per-parameter state (momentum, moments, step count) and applies one of
the update rules of ``optim.rules`` (the same rules as the server-side optimizers, so a learner
and ``kv.set_optimizer(server_optimizer_spec(learner))``, the spec made here, compute the same
numbers) to every named parameter, numpy or cupy. Distributed learners wrap a local learner (``update``, ``reset_momentum``).

Rules (``g`` the gradient plus ``weight_decay * w`` when that is set; CNTK's learners, whose
L2 regularization also adds to the gradient):

* ``sgd``:       ``w -= lr * g``
* ``momentum``:  ``mom = mu * mom - lr * g``; ``w += mom`` (with ``unit_gain``, CNTK's unit-gain
  momentum, ``lr * (1 - mu)`` in place of ``lr``): ``rules.sgd_momentum``
* ``nesterov``:  ``rules.nag``, ``lr * (1 - mu)`` in place of ``lr`` with ``unit_gain``
* ``adam``:      ``rules.adam``: ``w -= lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)``,
  epsilon not bias-corrected, as CNTK's ``adam`` (and MXNet's); see ``docs/learners.md``
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from trainer_core.optim import rules
from trainer_core.xp import array_module


def _positive(name: str, value: float, allow_zero: bool = False) -> float:
    ok = math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        raise ValueError(f"{name} must be {'non-negative' if allow_zero else 'positive'}, got {value!r}")
    return float(value)


class Learner:
    """Base: holds ``params`` (dict name -> array, updated in place) and per-parameter state."""

    name: ClassVar[str] = ""
    slots: ClassVar[tuple[str, ...]] = ()  # the per-parameter state it keeps

    def __init__(self, params: dict[str, Any], lr: float, weight_decay: float = 0.0) -> None:
        if not isinstance(params, dict):  # a list of arrays failed at the first step, "no gradient for [...]"
            raise TypeError(
                f"params: expected a dict of the arrays by parameter name, got {type(params).__name__}"
            )
        self.params = params
        self.lr = _positive("lr", lr)
        self.weight_decay = _positive("weight_decay", weight_decay, allow_zero=True)
        self.state: dict[str, dict[str, Any]] = {}
        self.steps = 0

    def update(self, grads: dict[str, Any]) -> None:
        """Apply one step with ``grads`` (same keys as ``params``)."""
        if not isinstance(grads, dict):
            raise TypeError(
                f"grads: expected a dict of the gradients by parameter name, got {type(grads).__name__}"
            )
        missing = set(self.params) - set(grads)
        if missing:
            raise KeyError(f"no gradient for {sorted(missing)}")
        self.steps += 1
        for key, w in self.params.items():
            self._step(key, w, grads[key])

    def reset_momentum(self) -> None:
        """Drop the optimizer state (block momentum resets local momentum after each sync)."""
        self.state.clear()
        self.steps = 0

    def load_state(self, state: dict[str, dict[str, Any]]) -> None:
        """Replace the per-parameter state by ``state`` (``self.state``'s form, e.g. from a
        checkpoint, arrays on the parameters' device); ``ValueError`` for a parameter or slot this
        learner does not have, before anything changes."""
        for key, per in state.items():
            if key not in self.params:
                raise ValueError(f"state for {key!r}, which is not a parameter")
            extra = set(per) - set(self.slots)
            if extra:
                raise ValueError(
                    f"{self.name} learner state has no slot {sorted(extra)} (its slots: {self.slots})"
                )
        self.state = {key: dict(per) for key, per in state.items()}

    def _slot(self, key: str, slot: str, like: Any) -> Any:
        per = self.state.setdefault(key, {})
        if slot not in per:
            per[slot] = array_module(like).zeros_like(like)
        return per[slot]

    def _step(self, key: str, w: Any, g: Any) -> None:
        raise NotImplementedError


class SGD(Learner):
    name: ClassVar[str] = "sgd"

    def _step(self, key: str, w: Any, g: Any) -> None:
        rules.sgd(w, g, self.lr, self.weight_decay)


class Momentum(Learner):
    name: ClassVar[str] = "momentum"
    slots: ClassVar[tuple[str, ...]] = ("mom",)

    def __init__(
        self,
        params: dict[str, Any],
        lr: float,
        momentum: float = 0.9,
        unit_gain: bool = False,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, lr, weight_decay)
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
        self.momentum = float(momentum)
        self.unit_gain = unit_gain

    @property
    def step_lr(self) -> float:
        """The rule's learning rate: ``lr``, times ``1 - momentum`` with unit gain."""
        return self.lr * (1.0 - self.momentum) if self.unit_gain else self.lr

    def load_state(self, state: dict[str, dict[str, Any]]) -> None:
        """As ``Learner.load_state``; a velocity ``v`` (checkpoints from before the learners shared
        ``optim.rules``: ``v = mu * v + g``, ``w -= lr * v``) becomes ``mom = -lr * v``."""
        super().load_state(
            {k: {"mom": -self.lr * per["v"]} if set(per) == {"v"} else per for k, per in state.items()}
        )

    def _step(self, key: str, w: Any, g: Any) -> None:
        mom = self._slot(key, "mom", w)
        rules.sgd_momentum(w, g, mom, self.step_lr, self.momentum, self.weight_decay)


class Nesterov(Momentum):
    name: ClassVar[str] = "nesterov"

    def _step(self, key: str, w: Any, g: Any) -> None:
        rules.nag(w, g, self._slot(key, "mom", w), self.step_lr, self.momentum, self.weight_decay)


class Adam(Learner):
    name: ClassVar[str] = "adam"
    slots: ClassVar[tuple[str, ...]] = ("m", "v", "t")

    def __init__(
        self,
        params: dict[str, Any],
        lr: float = 1e-3,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, lr, weight_decay)
        for n, b in (("beta1", beta1), ("beta2", beta2)):
            if not 0 <= b < 1:
                raise ValueError(f"{n} must be in [0, 1), got {b!r}")
        self.beta1, self.beta2, self.eps = float(beta1), float(beta2), _positive("eps", eps)

    def _step(self, key: str, w: Any, g: Any) -> None:
        m, v = self._slot(key, "m", w), self._slot(key, "v", w)
        t = self.state[key]["t"] = self.state[key].get("t", 0) + 1
        rules.adam(w, g, m, v, t, self.lr, self.beta1, self.beta2, self.eps, self.weight_decay)


LEARNERS: dict[str, type[Learner]] = {c.name: c for c in (SGD, Momentum, Nesterov, Adam)}


def get_learner(name: str, params: dict[str, Any], **kwargs: Any) -> Learner:
    """A learner by name (``sgd``, ``momentum``, ``nesterov``, ``adam``) over ``params``."""
    if name not in LEARNERS:
        raise ValueError(f"unknown learner {name!r}; known: {sorted(LEARNERS)}")
    return LEARNERS[name](params, **kwargs)


def server_optimizer_spec(learner: Learner, rescale_grad: float = 1.0) -> dict[str, Any]:
    """The server-side optimizer spec (``optim.server``) that applies ``learner``'s rule (both run
    ``optim.rules``: the server computes what the local learner would)."""
    wd = learner.weight_decay
    if isinstance(learner, Adam):
        return {
            "type": "adam",
            "learning_rate": learner.lr,
            "beta1": learner.beta1,
            "beta2": learner.beta2,
            "epsilon": learner.eps,
            "wd": wd,
            "rescale_grad": rescale_grad,
        }
    spec: dict[str, Any] = {
        "type": "sgd",
        "learning_rate": learner.lr,
        "wd": wd,
        "rescale_grad": rescale_grad,
    }
    if isinstance(learner, Momentum):
        spec.update(momentum=learner.momentum, nesterov=isinstance(learner, Nesterov))
        spec["learning_rate"] = learner.step_lr  # unit gain: lr * (1 - momentum)
    elif learner.name != "sgd":
        raise ValueError(f"no server-side optimizer for local learner {learner.name!r}")
    return spec
