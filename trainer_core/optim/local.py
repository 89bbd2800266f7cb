"""Local learners: SGD, momentum SGD, Nesterov and Adam, on dicts of parameter arrays.

The update rules are pure in-place functions on one array (numpy or cupy) each; a ``Learner``
holds the per-parameter state (velocities, moments, step count) and applies a rule to every
named parameter. Distributed learners wrap a local learner (``update``, ``reset_momentum``).

Rules (``g`` the gradient plus ``weight_decay * w`` when that is set):

* ``sgd``:       ``w -= lr * g``
* ``momentum``:  ``v = mu * v + g`` (``(1 - mu) * g`` with ``unit_gain``, CNTK's default); ``w -= lr * v``
* ``nesterov``:  ``v = mu * v + g``; ``w -= lr * (g + mu * v)``
* ``adam``:      ``m = b1 m + (1 - b1) g``; ``v = b2 v + (1 - b2) g^2``; ``t += 1``;
  ``w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)``
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from trainer_core.xp import array_module


def sgd_update(w: Any, g: Any, lr: float) -> None:
    w -= lr * g


def momentum_update(w: Any, g: Any, v: Any, lr: float, mu: float, unit_gain: bool = False) -> None:
    v *= mu
    v += (1.0 - mu) * g if unit_gain else g
    w -= lr * v


def nesterov_update(w: Any, g: Any, v: Any, lr: float, mu: float) -> None:
    v *= mu
    v += g
    w -= lr * (g + mu * v)


def adam_update(
    w: Any, g: Any, m: Any, v: Any, t: int, lr: float, beta1: float, beta2: float, eps: float
) -> None:
    """One Adam step; ``t`` is the step number after this update (1 for the first)."""
    xp = array_module(w)
    m *= beta1
    m += (1.0 - beta1) * g
    v *= beta2
    v += (1.0 - beta2) * (g * g)
    m_hat = m / (1.0 - beta1**t)
    v_hat = v / (1.0 - beta2**t)
    w -= lr * m_hat / (xp.sqrt(v_hat) + eps)


def _positive(name: str, value: float, allow_zero: bool = False) -> float:
    ok = math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        raise ValueError(f"{name} must be {'non-negative' if allow_zero else 'positive'}, got {value!r}")
    return float(value)


class Learner:
    """Base: holds ``params`` (dict name -> array, updated in place) and per-parameter state."""

    name: ClassVar[str] = ""

    def __init__(self, params: dict[str, Any], lr: float, weight_decay: float = 0.0) -> None:
        self.params = params
        self.lr = _positive("lr", lr)
        self.weight_decay = _positive("weight_decay", weight_decay, allow_zero=True)
        self.state: dict[str, dict[str, Any]] = {}
        self.steps = 0

    def update(self, grads: dict[str, Any]) -> None:
        """Apply one step with ``grads`` (same keys as ``params``)."""
        missing = set(self.params) - set(grads)
        if missing:
            raise KeyError(f"no gradient for {sorted(missing)}")
        self.steps += 1
        for key, w in self.params.items():
            g = grads[key]
            if self.weight_decay:
                g = g + self.weight_decay * w
            self._step(key, w, g)

    def reset_momentum(self) -> None:
        """Drop the optimizer state (block momentum resets local momentum after each sync)."""
        self.state.clear()
        self.steps = 0

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
        sgd_update(w, g, self.lr)


class Momentum(Learner):
    name: ClassVar[str] = "momentum"

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

    def _step(self, key: str, w: Any, g: Any) -> None:
        momentum_update(w, g, self._slot(key, "v", w), self.lr, self.momentum, self.unit_gain)


class Nesterov(Momentum):
    name: ClassVar[str] = "nesterov"

    def _step(self, key: str, w: Any, g: Any) -> None:
        nesterov_update(w, g, self._slot(key, "v", w), self.lr, self.momentum)


class Adam(Learner):
    name: ClassVar[str] = "adam"

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
        adam_update(w, g, m, v, t, self.lr, self.beta1, self.beta2, self.eps)


LEARNERS: dict[str, type[Learner]] = {c.name: c for c in (SGD, Momentum, Nesterov, Adam)}


def get_learner(name: str, params: dict[str, Any], **kwargs: Any) -> Learner:
    """A learner by name (``sgd``, ``momentum``, ``nesterov``, ``adam``) over ``params``."""
    if name not in LEARNERS:
        raise ValueError(f"unknown learner {name!r}; known: {sorted(LEARNERS)}")
    return LEARNERS[name](params, **kwargs)
