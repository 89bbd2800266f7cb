"""Server-side optimizers, sent to servers as plain data specs (never pickled).

A spec is a JSON object: ``{"type": "sgd", "learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4,
"nesterov": false, "rescale_grad": 1.0, "clip_gradient": null}`` or ``{"type": "adam",
"learning_rate": 0.001, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8, "wd": 0.0, ...}``.
``validate`` fills defaults and rejects anything else; ``build`` turns a spec into an updater.
The update rules are MXNet's (sgd_mom_update, nag_mom_update, adam_update).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np

from trainer_core.errors import OptimizerError


@dataclass(frozen=True)
class SGD:
    """SGD with optional momentum, Nesterov momentum and weight decay."""

    learning_rate: float = 0.01
    momentum: float = 0.0
    wd: float = 0.0
    nesterov: bool = False
    rescale_grad: float = 1.0
    clip_gradient: float | None = None

    def spec(self) -> dict[str, Any]:
        return {"type": "sgd", **asdict(self)}


@dataclass(frozen=True)
class Adam:
    """Adam with weight decay added to the gradient (as MXNet)."""

    learning_rate: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8
    wd: float = 0.0
    rescale_grad: float = 1.0
    clip_gradient: float | None = None

    def spec(self) -> dict[str, Any]:
        return {"type": "adam", **asdict(self)}


_CLASSES: dict[str, type[SGD] | type[Adam]] = {"sgd": SGD, "nag": SGD, "adam": Adam}


def to_spec(opt: Any, **kwargs: Any) -> dict[str, Any]:
    """A validated spec from an ``SGD``/``Adam`` object, a spec mapping, or a name plus keyword arguments."""
    if isinstance(opt, SGD | Adam):
        return validate(opt.spec())
    if isinstance(opt, str):
        return validate({"type": opt, **kwargs})
    if isinstance(opt, Mapping):
        return validate(dict(opt))
    raise OptimizerError(
        f"unsupported optimizer {opt!r}: pass trainer_core.optim.server.SGD/Adam, a spec dict or a name"
    )


def validate(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The spec with defaults filled in; ``OptimizerError`` for an unknown type, field or value."""
    kind = spec.get("type")
    if not isinstance(kind, str) or kind.lower() not in _CLASSES:
        raise OptimizerError(f"unsupported optimizer type {kind!r}; known: {', '.join(sorted(_CLASSES))}")
    kind = kind.lower()
    fields = {k: v for k, v in spec.items() if k != "type"}
    if kind == "nag":
        fields["nesterov"] = True
    try:
        obj = _CLASSES[kind](**fields)
    except TypeError as exc:
        raise OptimizerError(f"bad {kind} optimizer fields: {exc}") from None
    out = obj.spec()
    for name, value in out.items():
        if name == "type" or value is None:
            continue
        if name == "nesterov":
            if not isinstance(value, bool):
                raise OptimizerError("nesterov must be true or false")
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise OptimizerError(f"optimizer field {name}={value!r} must be a finite number")
    return out


class Updater(Protocol):
    """Applies one update in place: ``weight`` and ``grad`` are flat arrays, ``state`` is per key part."""

    def create_state(self, weight: np.ndarray) -> dict[str, Any]: ...

    def update(self, weight: np.ndarray, grad: np.ndarray, state: dict[str, Any]) -> None: ...


def _prepare(spec: Mapping[str, Any], weight: np.ndarray, grad: np.ndarray) -> np.ndarray:
    g = grad * np.asarray(spec["rescale_grad"], dtype=weight.dtype)
    clip = spec.get("clip_gradient")
    if clip is not None and clip >= 0:
        np.clip(g, -clip, clip, out=g)
    return g


class _SGDUpdater:
    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.spec = spec

    def create_state(self, weight: np.ndarray) -> dict[str, Any]:
        return {"mom": np.zeros_like(weight)} if self.spec["momentum"] != 0 else {}

    def update(self, weight: np.ndarray, grad: np.ndarray, state: dict[str, Any]) -> None:
        s = self.spec
        lr, mu, wd = s["learning_rate"], s["momentum"], s["wd"]
        g = _prepare(s, weight, grad)
        if wd:
            g += wd * weight
        if mu == 0:
            weight -= lr * g
        elif s["nesterov"]:
            mom = state["mom"]
            mom *= mu
            mom += g
            weight -= lr * (g + mu * mom)
        else:
            mom = state["mom"]
            mom *= mu
            mom -= lr * g
            weight += mom


class _AdamUpdater:
    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.spec = spec

    def create_state(self, weight: np.ndarray) -> dict[str, Any]:
        return {"m": np.zeros_like(weight), "v": np.zeros_like(weight), "t": 0}

    def update(self, weight: np.ndarray, grad: np.ndarray, state: dict[str, Any]) -> None:
        s = self.spec
        b1, b2 = s["beta1"], s["beta2"]
        state["t"] += 1
        t = state["t"]
        g = _prepare(s, weight, grad)
        if s["wd"]:
            g += s["wd"] * weight
        m, v = state["m"], state["v"]
        m *= b1
        m += (1 - b1) * g
        v *= b2
        v += (1 - b2) * g * g
        lr_t = s["learning_rate"] * math.sqrt(1 - b2**t) / (1 - b1**t)
        weight -= lr_t * m / (np.sqrt(v) + s["epsilon"])


def build(spec: Mapping[str, Any]) -> Updater:
    """The updater for a validated spec."""
    spec = validate(spec)
    return _SGDUpdater(spec) if spec["type"] == "sgd" else _AdamUpdater(spec)
