"""The optimizer update rules: one set, shared by the server-side optimizers (``optim.server``,
what ``kv.set_optimizer`` ships to servers) and the local learners (``optim.local``).

Each rule updates a weight and its state arrays in place, on numpy or cupy arrays alike (the
array module is the weight's, ``xp.array_module``). They are MXNet 1.9.1's kernels
(``sgd_update``, ``sgd_mom_update``, ``nag_mom_update``, ``adam_update`` with the step size of
``mxnet.optimizer.Adam``), checked against MXNet itself in ``tests/compat/test_optimizers.py``.
``g`` below is the gradient after ``prepare``: ``rescale_grad * grad``, clipped to
``[-clip_gradient, clip_gradient]`` when ``clip_gradient`` is set and positive (MXNet turns
clipping off for ``None``, zero and negative values), then ``wd * w`` added:

* ``sgd``:          ``w -= lr * g``
* ``sgd_momentum``: ``mom = momentum * mom - lr * g``; ``w += mom``
* ``nag``:          ``mom = momentum * mom``; ``w += (1 + momentum) * (mom - lr * g) - mom``;
  ``mom -= lr * g`` (MXNet computes this last ``g``'s weight decay at the updated ``w``)
* ``adam``:         ``m = beta1 * m + (1 - beta1) * g``; ``v = beta2 * v + (1 - beta2) * g**2``;
  ``w -= lr * sqrt(1 - beta2**t) / (1 - beta1**t) * m / (sqrt(v) + epsilon)``, ``t`` the step
  number (1 first). The bias correction is folded into the step size, so ``epsilon`` is not
  bias-corrected (Kingma and Ba's "efficient version", MXNet's and CNTK's ``adam`` alike), unlike
  ``m_hat / (sqrt(v_hat) + epsilon)`` (PyTorch), which differs while ``sqrt(v)`` is near
  ``epsilon``. For Adam alone the weight decay is added before clipping, as in MXNet.
"""

from __future__ import annotations

import math
from typing import Any

from trainer_core.xp import array_module


def _clip(xp: Any, g: Any, clip_gradient: float | None) -> None:
    if clip_gradient is not None and clip_gradient > 0:
        xp.clip(g, -clip_gradient, clip_gradient, out=g)


def prepare(w: Any, grad: Any, wd: float, rescale_grad: float, clip_gradient: float | None) -> Any:
    """A new array: ``clip(rescale_grad * grad) + wd * w`` (SGD, momentum and NAG)."""
    xp = array_module(w)
    g = grad * rescale_grad
    _clip(xp, g, clip_gradient)
    if wd:
        g += wd * w
    return g


def sgd(
    w: Any,
    grad: Any,
    lr: float,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
) -> None:
    """Plain SGD (MXNet's ``sgd_update``)."""
    w -= lr * prepare(w, grad, wd, rescale_grad, clip_gradient)


def sgd_momentum(
    w: Any,
    grad: Any,
    mom: Any,
    lr: float,
    momentum: float,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
) -> None:
    """Heavy-ball momentum with the learning rate inside ``mom`` (MXNet's ``sgd_mom_update``; CNTK's
    ``momentum_sgd`` keeps ``-mom``, the same numbers)."""
    g = prepare(w, grad, wd, rescale_grad, clip_gradient)
    mom *= momentum
    mom -= lr * g
    w += mom


def nag(
    w: Any,
    grad: Any,
    mom: Any,
    lr: float,
    momentum: float,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
) -> None:
    """Nesterov accelerated gradient as MXNet 1.9.1's ``nag_mom_update`` (``mom`` holds the learning
    rate, as in ``sgd_momentum``): ``mom = momentum * mom``; ``w += (1 + momentum) * (mom - lr * g)
    - mom``; ``mom -= lr * (clip(rescale_grad * grad) + wd * w)``, the last with the *updated*
    ``w`` (MXNet writes the weight in place before it updates the momentum). Without weight decay
    this is Nesterov's step exactly: ``s = momentum * s + g``; ``w -= lr * (g + momentum * s)``
    with ``mom = -lr * s``."""
    xp = array_module(w)
    g = grad * rescale_grad
    _clip(xp, g, clip_gradient)
    step = lr * (g + wd * w) if wd else lr * g
    mom *= momentum
    w += (1.0 + momentum) * (mom - step) - mom
    if wd:
        g += wd * w
    mom -= lr * g


def adam_step_size(lr: float, beta1: float, beta2: float, t: int) -> float:
    """``lr * sqrt(1 - beta2**t) / (1 - beta1**t)``: Adam's bias correction at step ``t`` (1 first)."""
    if t < 1:
        raise ValueError(f"Adam's step number starts at 1, got {t}")
    return lr * math.sqrt(1.0 - beta2**t) / (1.0 - beta1**t)


def adam(
    w: Any,
    grad: Any,
    m: Any,
    v: Any,
    t: int,
    lr: float,
    beta1: float,
    beta2: float,
    epsilon: float,
    wd: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
) -> None:
    """One Adam step; ``t`` is the number of this step (1 for the first)."""
    xp = array_module(w)
    g = grad * rescale_grad
    if wd:
        g += wd * w
    _clip(xp, g, clip_gradient)
    m *= beta1
    m += (1.0 - beta1) * g
    g *= g
    v *= beta2
    v += (1.0 - beta2) * g
    denom = xp.sqrt(v)
    denom += epsilon
    w -= adam_step_size(lr, beta1, beta2, t) * m / denom
