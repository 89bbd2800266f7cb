"""A small multilayer perceptron on numpy or cupy, with a hand-written backward pass.

Dense layers with ReLU between them and softmax cross-entropy on top. The parameters are a
plain ordered dict of arrays (``W0, b0, W1, b1, ...``; ``W{i}`` has shape ``(sizes[i], sizes[i+1])``)
so that optimizers, the KV store and checkpoints treat them as named arrays. The core is pure
functions (``forward``, ``backward``, ``softmax_cross_entropy``); ``MLP`` bundles them.

>>> net = MLP([64, 128, 10], seed=0)
>>> loss, grads = net.loss_and_grads(x, y)     # x: (batch, 64) floats, y: (batch,) int labels
>>> net.params["W0"] -= 0.1 * grads["W0"]
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import numpy as np

from trainer_core.xp import array_module

Params = dict[str, Any]


def init_params(sizes: Sequence[int], seed: int = 0, dtype: Any = np.float32, xp: Any = np) -> Params:
    """He-normal weights (std ``sqrt(2 / fan_in)``) and zero biases, deterministic in ``seed``."""
    if len(sizes) < 2 or any(int(s) <= 0 for s in sizes):
        raise ValueError(f"sizes must list at least two positive layer widths, got {list(sizes)}")
    rng = np.random.default_rng(seed)
    params: Params = {}
    for i, (fan_in, fan_out) in enumerate(pairwise(int(s) for s in sizes)):
        w = rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)
        params[f"W{i}"] = xp.asarray(w.astype(dtype))
        params[f"b{i}"] = xp.zeros(fan_out, dtype=dtype)
    return params


def num_layers(params: Params) -> int:
    return len(params) // 2


def forward(params: Params, x: Any) -> tuple[Any, list[Any]]:
    """Logits for a batch ``x`` (batch, in) and the activations the backward pass needs."""
    xp = array_module(x)
    acts = [x]
    h = x
    last = num_layers(params) - 1
    for i in range(last + 1):
        h = h @ params[f"W{i}"] + params[f"b{i}"]
        if i < last:
            h = xp.maximum(h, 0)
        acts.append(h)
    return h, acts


def softmax_cross_entropy(logits: Any, labels: Any) -> tuple[float, Any]:
    """Mean cross-entropy of ``softmax(logits)`` against integer ``labels``, and its gradient."""
    xp = array_module(logits)
    n = logits.shape[0]
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_z = xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))
    log_p = shifted - log_z
    rows = xp.arange(n)
    loss = -float(log_p[rows, labels].mean())
    dlogits = xp.exp(log_p)
    dlogits[rows, labels] -= 1
    dlogits /= n
    return loss, dlogits


def backward(params: Params, acts: list[Any], dlogits: Any) -> Params:
    """Gradients of the loss with respect to every parameter, given ``d loss / d logits``."""
    grads: Params = {}
    delta = dlogits
    for i in reversed(range(num_layers(params))):
        grads[f"W{i}"] = acts[i].T @ delta
        grads[f"b{i}"] = delta.sum(axis=0)
        if i > 0:
            delta = (delta @ params[f"W{i}"].T) * (acts[i] > 0)
    return {k: grads[k] for k in params}


class MLP:
    """Dense layers + ReLU + softmax cross-entropy; ``params`` is a dict of arrays, updated in place."""

    def __init__(self, sizes: Sequence[int], seed: int = 0, dtype: Any = np.float32, xp: Any = np) -> None:
        self.sizes = [int(s) for s in sizes]
        self.params = init_params(self.sizes, seed, dtype, xp)

    def forward(self, x: Any) -> Any:
        """Logits for a batch."""
        return forward(self.params, x)[0]

    def loss(self, x: Any, y: Any) -> float:
        """Mean softmax cross-entropy on a batch."""
        return softmax_cross_entropy(self.forward(x), y)[0]

    def loss_and_grads(self, x: Any, y: Any) -> tuple[float, Params]:
        """Loss and gradients (same keys and shapes as ``params``) on a batch."""
        logits, acts = forward(self.params, x)
        loss, dlogits = softmax_cross_entropy(logits, y)
        return loss, backward(self.params, acts, dlogits)

    def backward(self, x: Any, y: Any) -> Params:
        """Gradients only."""
        return self.loss_and_grads(x, y)[1]

    def predict(self, x: Any) -> Any:
        """Predicted class per row."""
        return self.forward(x).argmax(axis=1)

    def accuracy(self, x: Any, y: Any) -> float:
        """Fraction of rows classified correctly."""
        return float((self.predict(x) == y).mean())

    def num_parameters(self) -> int:
        return sum(int(p.size) for p in self.params.values())
