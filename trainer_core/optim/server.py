"""Server-side optimizers, sent to servers as plain data specs (never pickled).

A spec is a JSON object: ``{"type": "sgd", "learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4,
"nesterov": false, "rescale_grad": 1.0, "clip_gradient": null}`` or ``{"type": "adam",
"learning_rate": 0.001, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8, "wd": 0.0, ...}``.
``validate`` fills defaults and rejects anything else; ``build`` turns a spec into an updater,
which applies the rules of ``optim.rules`` (MXNet's ``sgd_update``, ``sgd_mom_update``,
``nag_mom_update``, ``adam_update``) with the spec's fields and keeps the state per key part
(``mom``; ``m``, ``v`` and the step count ``t``). ``clip_gradient`` of ``None``, zero or less is
off, as in MXNet.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from trainer_core.errors import OptimizerError
from trainer_core.optim import rules
from trainer_core.xp import array_module


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

    def create_state(self, weight: Any) -> dict[str, Any]: ...

    def update(self, weight: Any, grad: Any, state: dict[str, Any]) -> None: ...


class _SGDUpdater:
    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.spec = spec
        self.common = {k: spec[k] for k in ("wd", "rescale_grad", "clip_gradient")}

    def create_state(self, weight: Any) -> dict[str, Any]:
        return {"mom": array_module(weight).zeros_like(weight)} if self.spec["momentum"] != 0 else {}

    def update(self, weight: Any, grad: Any, state: dict[str, Any]) -> None:
        lr, mu = self.spec["learning_rate"], self.spec["momentum"]
        if mu == 0:
            rules.sgd(weight, grad, lr, **self.common)
        elif self.spec["nesterov"]:
            rules.nag(weight, grad, state["mom"], lr, mu, **self.common)
        else:
            rules.sgd_momentum(weight, grad, state["mom"], lr, mu, **self.common)


class _AdamUpdater:
    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.spec = spec

    def create_state(self, weight: Any) -> dict[str, Any]:
        xp = array_module(weight)
        return {"m": xp.zeros_like(weight), "v": xp.zeros_like(weight), "t": 0}

    def update(self, weight: Any, grad: Any, state: dict[str, Any]) -> None:
        s = self.spec
        state["t"] += 1
        rules.adam(
            weight,
            grad,
            state["m"],
            state["v"],
            state["t"],
            s["learning_rate"],
            s["beta1"],
            s["beta2"],
            s["epsilon"],
            s["wd"],
            s["rescale_grad"],
            s["clip_gradient"],
        )


def build(spec: Mapping[str, Any]) -> Updater:
    """The updater for a validated spec."""
    spec = validate(spec)
    return _SGDUpdater(spec) if spec["type"] == "sgd" else _AdamUpdater(spec)
