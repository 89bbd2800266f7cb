"""optim.rules against reference formulas written here element by element (Python floats), step by
step, through all three ways in: the rule functions, the server-side updaters (``optim.server``)
and the local learners (``optim.local``). MXNet itself: ``tests/compat/test_optimizers.py``."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from trainer_core.optim import local, rules, server

STEPS = 5
LR, MU, WD, RESCALE, CLIP = 0.1, 0.9, 0.01, 0.5, 0.6
B1, B2, EPS = 0.8, 0.99, 1e-3  # a large epsilon, so where it goes shows


def data(seed: int = 0) -> tuple[list[float], list[list[float]]]:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(8).tolist()
    grads = [(2.0 * rng.standard_normal(8)).tolist() for _ in range(STEPS)]  # some beyond CLIP / RESCALE
    return w, grads


def clip(x: float, c: float | None) -> float:
    return x if c is None or c <= 0 else min(max(x, -c), c)


# -- reference formulas, one element at a time --------------------------------------------------------
def ref_sgd(w, grads, lr, wd, rescale, c):
    out = []
    for g in grads:
        w = [wi - lr * (clip(rescale * gi, c) + wd * wi) for wi, gi in zip(w, g, strict=True)]
        out.append(w)
    return out


def ref_momentum(w, grads, lr, mu, wd, rescale, c):
    """Velocity form: v = mu v + g; w -= lr v (the rule keeps -lr v, the same under a fixed lr)."""
    v, out = [0.0] * len(w), []
    for g in grads:
        v = [mu * vi + clip(rescale * gi, c) + wd * wi for vi, wi, gi in zip(v, w, g, strict=True)]
        w = [wi - lr * vi for wi, vi in zip(w, v, strict=True)]
        out.append(w)
    return out


def ref_nesterov(w, grads, lr, mu, wd, rescale, c):
    """w -= lr (g + mu (mu v + g)); then v = mu v + g with g's decay taken at the new w (MXNet)."""
    v, out = [0.0] * len(w), []
    for g in grads:
        gc = [clip(rescale * gi, c) for gi in g]
        new_w = [
            wi - lr * (gi + wd * wi + mu * (mu * vi + gi + wd * wi))
            for wi, vi, gi in zip(w, v, gc, strict=True)
        ]
        v = [mu * vi + gi + wd * wi for vi, gi, wi in zip(v, gc, new_w, strict=True)]
        w = new_w
        out.append(w)
    return out


def ref_adam(w, grads, lr, b1, b2, eps, wd, rescale, c):
    """Kingma and Ba, Algorithm 1 with the step size alpha_t (their section 2 note): epsilon as is."""
    m, v, out = [0.0] * len(w), [0.0] * len(w), []
    for t, g in enumerate(grads, start=1):
        gg = [clip(rescale * gi + wd * wi, c) for gi, wi in zip(g, w, strict=True)]
        m = [b1 * mi + (1 - b1) * gi for mi, gi in zip(m, gg, strict=True)]
        v = [b2 * vi + (1 - b2) * gi * gi for vi, gi in zip(v, gg, strict=True)]
        alpha = lr * math.sqrt(1 - b2**t) / (1 - b1**t)
        w = [wi - alpha * mi / (math.sqrt(vi) + eps) for wi, mi, vi in zip(w, m, v, strict=True)]
        out.append(w)
    return out


def check(got: list[np.ndarray], want: list[list[float]]) -> None:
    assert len(got) == len(want) == STEPS
    for t, (a, b) in enumerate(zip(got, want, strict=True), start=1):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14, err_msg=f"step {t}")


def run(
    step: Callable[[np.ndarray, np.ndarray], None], w0: list[float], grads: list[list[float]]
) -> list[np.ndarray]:
    w, out = np.array(w0), []
    for g in grads:
        step(w, np.array(g))
        out.append(w.copy())
    return out


# -- the rule functions --------------------------------------------------------------------------------
@pytest.mark.parametrize("c", [CLIP, None, 0.0, -1.0])
def test_rules_match_the_references(c: float | None) -> None:
    w0, grads = data()
    check(
        run(lambda w, g: rules.sgd(w, g, LR, WD, RESCALE, c), w0, grads),
        ref_sgd(w0, grads, LR, WD, RESCALE, c),
    )
    mom = np.zeros(8)
    got = run(lambda w, g: rules.sgd_momentum(w, g, mom, LR, MU, WD, RESCALE, c), w0, grads)
    check(got, ref_momentum(w0, grads, LR, MU, WD, RESCALE, c))
    mom = np.zeros(8)
    got = run(lambda w, g: rules.nag(w, g, mom, LR, MU, WD, RESCALE, c), w0, grads)
    check(got, ref_nesterov(w0, grads, LR, MU, WD, RESCALE, c))
    m, v, t = np.zeros(8), np.zeros(8), [0]

    def adam(w: np.ndarray, g: np.ndarray) -> None:
        t[0] += 1
        rules.adam(w, g, m, v, t[0], LR, B1, B2, EPS, WD, RESCALE, c)

    check(run(adam, w0, grads), ref_adam(w0, grads, LR, B1, B2, EPS, WD, RESCALE, c))


def test_nesterov_without_weight_decay_is_the_textbook_step() -> None:
    w0, grads = data(1)
    v, w, want = [0.0] * 8, list(w0), []
    for g in grads:  # Sutskever et al.'s form as PyTorch writes it: v = mu v + g; w -= lr (g + mu v)
        v = [MU * vi + gi for vi, gi in zip(v, g, strict=True)]
        w = [wi - LR * (gi + MU * vi) for wi, gi, vi in zip(w, g, v, strict=True)]
        want.append(w)
    mom = np.zeros(8)
    check(run(lambda w, g: rules.nag(w, g, mom, LR, MU), w0, grads), want)


def test_adam_epsilon_is_not_bias_corrected() -> None:
    """With epsilon near sqrt(v) the two textbook forms differ; the rule is alpha_t m / (sqrt(v) + eps)."""
    w0, grads = data(2)
    small = [[1e-3 * x for x in g] for g in grads]
    m, v, ts = np.zeros(8), np.zeros(8), iter(range(1, STEPS + 1))
    got = run(lambda w, g: rules.adam(w, g, m, v, next(ts), LR, B1, B2, EPS), w0, small)
    check(got, ref_adam(w0, small, LR, B1, B2, EPS, 0.0, 1.0, None))
    mh = vh = np.zeros(8)
    w = np.array(w0)
    for t, g in enumerate(small, start=1):
        mh = B1 * mh + (1 - B1) * np.array(g)
        vh = B2 * vh + (1 - B2) * np.array(g) ** 2
        w = w - LR * (mh / (1 - B1**t)) / (np.sqrt(vh / (1 - B2**t)) + EPS)
    assert np.max(np.abs((w - w0) - (got[-1] - w0))) > 0.05 * np.max(np.abs(got[-1] - w0))
    with pytest.raises(ValueError, match="starts at 1"):
        rules.adam_step_size(LR, B1, B2, 0)


# -- the server-side optimizers ------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["sgd", "momentum", "nag", "adam"])
def test_server_updaters_match_the_references(kind: str) -> None:
    w0, grads = data(3)
    common = {"learning_rate": LR, "wd": WD, "rescale_grad": RESCALE, "clip_gradient": CLIP}
    cases: dict[str, tuple[dict[str, Any], list[list[float]]]] = {
        "sgd": ({"type": "sgd"}, ref_sgd(w0, grads, LR, WD, RESCALE, CLIP)),
        "momentum": ({"type": "sgd", "momentum": MU}, ref_momentum(w0, grads, LR, MU, WD, RESCALE, CLIP)),
        "nag": ({"type": "nag", "momentum": MU}, ref_nesterov(w0, grads, LR, MU, WD, RESCALE, CLIP)),
        "adam": (
            {"type": "adam", "beta1": B1, "beta2": B2, "epsilon": EPS},
            ref_adam(w0, grads, LR, B1, B2, EPS, WD, RESCALE, CLIP),
        ),
    }
    spec, want = cases[kind]
    up = server.build({**spec, **common})
    state = up.create_state(np.array(w0))
    check(run(lambda w, g: up.update(w, g, state), w0, grads), want)
    assert sorted(state) == {"sgd": [], "momentum": ["mom"], "nag": ["mom"], "adam": ["m", "t", "v"]}[kind]
    if kind == "adam":
        assert state["t"] == STEPS


def test_server_updaters_keep_float32() -> None:
    for spec in ({"type": "sgd", "momentum": 0.9}, {"type": "nag", "momentum": 0.9}, {"type": "adam"}):
        up = server.build(spec)
        w = np.ones(4, np.float32)
        state = up.create_state(w)
        up.update(w, np.full(4, 0.5, np.float32), state)
        assert w.dtype == np.float32 and all(
            a.dtype == np.float32 for a in state.values() if isinstance(a, np.ndarray)
        )
        assert np.all(w < 1)


# -- the local learners --------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["sgd", "momentum", "momentum-unit-gain", "nesterov", "adam"])
def test_learners_match_the_references(kind: str) -> None:
    w0, grads = data(4)
    name, kwargs, want = {
        "sgd": ("sgd", {}, ref_sgd(w0, grads, LR, WD, 1.0, None)),
        "momentum": ("momentum", {"momentum": MU}, ref_momentum(w0, grads, LR, MU, WD, 1.0, None)),
        "momentum-unit-gain": (
            "momentum",
            {"momentum": MU, "unit_gain": True},
            ref_momentum(w0, grads, LR * (1 - MU), MU, WD, 1.0, None),
        ),
        "nesterov": ("nesterov", {"momentum": MU}, ref_nesterov(w0, grads, LR, MU, WD, 1.0, None)),
        "adam": (
            "adam",
            {"beta1": B1, "beta2": B2, "eps": EPS},
            ref_adam(w0, grads, LR, B1, B2, EPS, WD, 1.0, None),
        ),
    }[kind]
    params = {"w": np.array(w0)}
    learner = local.get_learner(name, params, lr=LR, weight_decay=WD, **kwargs)
    out = []
    for g in grads:
        learner.update({"w": np.array(g)})
        out.append(params["w"].copy())
    check(out, want)
