"""The MLP: shapes, determinism, a numerical-gradient check in float64, and that it learns."""

from __future__ import annotations

import numpy as np
import pytest

from trainer_core.train.nn import MLP, backward, forward, softmax_cross_entropy


def test_parameter_layout():
    net = MLP([64, 128, 10], seed=0)
    assert list(net.params) == ["W0", "b0", "W1", "b1"]
    assert net.params["W0"].shape == (64, 128) and net.params["b1"].shape == (10,)
    assert net.params["W0"].dtype == np.float32
    assert net.num_parameters() == 64 * 128 + 128 + 128 * 10 + 10
    # He init: std sqrt(2 / fan_in)
    assert net.params["W0"].std() == pytest.approx(np.sqrt(2 / 64), rel=0.05)
    assert not net.params["b0"].any()


def test_seed_is_deterministic():
    a, b, c = MLP([5, 4, 3], seed=1), MLP([5, 4, 3], seed=1), MLP([5, 4, 3], seed=2)
    for k in a.params:
        np.testing.assert_array_equal(a.params[k], b.params[k])
    assert not np.array_equal(a.params["W0"], c.params["W0"])


@pytest.mark.parametrize("sizes", [[1], [3, 0, 2], []])
def test_bad_sizes(sizes):
    with pytest.raises(ValueError, match="sizes"):
        MLP(sizes)


def test_softmax_cross_entropy_values():
    logits = np.array([[0.0, 0.0], [1000.0, 0.0]])  # the second row would overflow a naive exp
    loss, d = softmax_cross_entropy(logits, np.array([0, 1]))
    assert loss == pytest.approx((np.log(2) + 1000.0) / 2)
    np.testing.assert_allclose(d, [[-0.25, 0.25], [0.5, -0.5]])


@pytest.mark.parametrize("sizes", [[5, 3], [5, 7, 3], [4, 6, 5, 3]])
def test_gradients_match_numerical_gradients(sizes):
    rng = np.random.default_rng(0)
    net = MLP(sizes, seed=3, dtype=np.float64)
    for k in net.params:  # non-zero biases so every term of the backward pass is exercised
        net.params[k] += 0.1 * rng.standard_normal(net.params[k].shape)
    x = rng.standard_normal((6, sizes[0]))
    y = rng.integers(0, sizes[-1], size=6)
    _, grads = net.loss_and_grads(x, y)
    eps = 1e-6
    for k, p in net.params.items():
        num = np.zeros_like(p)
        for i in np.ndindex(p.shape):
            old = p[i]
            p[i] = old + eps
            up = net.loss(x, y)
            p[i] = old - eps
            down = net.loss(x, y)
            p[i] = old
            num[i] = (up - down) / (2 * eps)
        np.testing.assert_allclose(grads[k], num, rtol=1e-5, atol=1e-8, err_msg=k)


def test_pure_functions_agree_with_the_class():
    rng = np.random.default_rng(1)
    net = MLP([4, 5, 3], seed=0, dtype=np.float64)
    x, y = rng.standard_normal((7, 4)), rng.integers(0, 3, size=7)
    logits, acts = forward(net.params, x)
    loss, d = softmax_cross_entropy(logits, y)
    grads = backward(net.params, acts, d)
    loss2, grads2 = net.loss_and_grads(x, y)
    assert loss == loss2 and list(grads) == list(net.params)
    for k in grads:
        np.testing.assert_array_equal(grads[k], grads2[k])


def test_it_learns_a_separable_problem():
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((3, 8)) * 3
    y = rng.integers(0, 3, size=300)
    x = (centers[y] + rng.standard_normal((300, 8))).astype(np.float32)
    net = MLP([8, 16, 3], seed=0)
    first = net.loss(x, y)
    for _ in range(100):
        _, g = net.loss_and_grads(x, y)
        for k in net.params:
            net.params[k] -= 0.1 * g[k]
    assert net.loss(x, y) < 0.3 * first
    assert net.accuracy(x, y) > 0.95
    assert net.predict(x).shape == (300,)
