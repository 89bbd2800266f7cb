"""Local learners against reference update equations on small arrays."""

from __future__ import annotations

import numpy as np
import pytest

from trainer_core.optim.local import LEARNERS, Adam, Momentum, Nesterov, get_learner


def setup(seed=0):
    rng = np.random.default_rng(seed)
    params = {"w": rng.standard_normal((3, 4)), "b": rng.standard_normal(4)}
    grads = [{k: rng.standard_normal(v.shape) for k, v in params.items()} for _ in range(4)]
    return params, grads


def test_sgd():
    params, grads = setup()
    ref = {k: v.copy() for k, v in params.items()}
    opt = get_learner("sgd", params, lr=0.1)
    for g in grads:
        opt.update(g)
        for k in ref:
            ref[k] = ref[k] - 0.1 * g[k]
    for k in ref:
        np.testing.assert_allclose(params[k], ref[k], rtol=1e-12)


@pytest.mark.parametrize("unit_gain", [False, True])
def test_momentum(unit_gain):
    params, grads = setup()
    ref, vel = {k: v.copy() for k, v in params.items()}, {k: 0.0 for k in params}
    opt = get_learner("momentum", params, lr=0.05, momentum=0.8, unit_gain=unit_gain)
    for g in grads:
        opt.update(g)
        for k in ref:
            vel[k] = 0.8 * vel[k] + (0.2 * g[k] if unit_gain else g[k])
            ref[k] = ref[k] - 0.05 * vel[k]
    for k in ref:
        np.testing.assert_allclose(params[k], ref[k], rtol=1e-12)


def test_nesterov():
    params, grads = setup()
    ref, vel = {k: v.copy() for k, v in params.items()}, {k: 0.0 for k in params}
    opt = Nesterov(params, lr=0.05, momentum=0.9)
    for g in grads:
        opt.update(g)
        for k in ref:
            vel[k] = 0.9 * vel[k] + g[k]
            ref[k] = ref[k] - 0.05 * (g[k] + 0.9 * vel[k])
    for k in ref:
        np.testing.assert_allclose(params[k], ref[k], rtol=1e-12)


def test_adam():
    params, grads = setup()
    ref = {k: v.copy() for k, v in params.items()}
    m = {k: 0.0 for k in params}
    v = {k: 0.0 for k in params}
    opt = Adam(params, lr=0.01, beta1=0.9, beta2=0.99, eps=1e-8)
    for t, g in enumerate(grads, start=1):
        opt.update(g)
        for k in ref:
            m[k] = 0.9 * m[k] + 0.1 * g[k]
            v[k] = 0.99 * v[k] + 0.01 * g[k] ** 2
            # CNTK's (and MXNet's) form: the bias correction scales the step, not epsilon
            step = 0.01 * np.sqrt(1 - 0.99**t) / (1 - 0.9**t)
            ref[k] = ref[k] - step * m[k] / (np.sqrt(v[k]) + 1e-8)
    for k in ref:
        np.testing.assert_allclose(params[k], ref[k], rtol=1e-12)


def test_nesterov_unit_gain_scales_the_learning_rate():
    params, grads = setup()
    ref, vel = {k: v.copy() for k, v in params.items()}, {k: 0.0 for k in params}
    opt = Nesterov(params, lr=0.05, momentum=0.9, unit_gain=True)
    for g in grads:
        opt.update(g)
        for k in ref:
            vel[k] = 0.9 * vel[k] + 0.1 * g[k]
            ref[k] = ref[k] - 0.05 * (0.1 * g[k] + 0.9 * vel[k])
    for k in ref:
        np.testing.assert_allclose(params[k], ref[k], rtol=1e-12)


def test_weight_decay_and_reset():
    params, grads = setup()
    w0 = params["w"].copy()
    opt = Momentum(params, lr=0.1, momentum=0.5, weight_decay=0.01)
    opt.update(grads[0])
    np.testing.assert_allclose(params["w"], w0 - 0.1 * (grads[0]["w"] + 0.01 * w0))
    assert opt.state and opt.steps == 1
    opt.reset_momentum()
    assert not opt.state and opt.steps == 0
    w1 = params["w"].copy()
    opt.update(grads[1])  # after a reset the velocity starts again from zero
    np.testing.assert_allclose(params["w"], w1 - 0.1 * (grads[1]["w"] + 0.01 * w1))


def test_parameters_are_updated_in_place():
    params, grads = setup()
    w = params["w"]
    for name in LEARNERS:
        get_learner(name, params, lr=0.01).update(grads[0])
        assert params["w"] is w


@pytest.mark.parametrize(
    ("name", "kwargs", "match"),
    [
        ("rmsprop", {"lr": 0.1}, "unknown learner"),
        ("sgd", {"lr": 0.0}, "lr"),
        ("sgd", {"lr": float("nan")}, "lr"),
        ("momentum", {"lr": 0.1, "momentum": 1.0}, "momentum"),
        ("adam", {"lr": 0.1, "beta2": 1.0}, "beta2"),
        ("sgd", {"lr": 0.1, "weight_decay": -1.0}, "weight_decay"),
    ],
)
def test_bad_arguments(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        get_learner(name, {"w": np.zeros(2)}, **kwargs)


def test_missing_gradient():
    params, _ = setup()
    with pytest.raises(KeyError, match="b"):
        get_learner("sgd", params, lr=0.1).update({"w": np.zeros((3, 4))})


def test_params_and_grads_that_are_not_dicts_are_named() -> None:
    """A list of arrays as params was taken, and failed at the first step with "no gradient for
    [...]" naming the arrays; a list of gradients said "no gradient for" every parameter."""
    with pytest.raises(TypeError, match="params: expected a dict of the arrays by parameter name, got list"):
        get_learner("sgd", [np.zeros(2)], lr=0.1)
    learner = get_learner("sgd", {"w": np.zeros(2)}, lr=0.1)
    with pytest.raises(
        TypeError, match="grads: expected a dict of the gradients by parameter name, got list"
    ):
        learner.update([np.ones(2)])  # type: ignore[arg-type]
