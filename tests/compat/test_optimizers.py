"""Our optimizer rules against MXNet 1.9.1's own optimizers (``mx.optimizer.create(...).update``)
on the same inputs, step by step: the server-side optimizers (``optim.server.build``, what
``kv.set_optimizer`` runs) and the local learners (``optim.local``), float32 and float64.

The inputs exercise ``rescale_grad``, ``clip_gradient`` (with some gradients beyond it; zero is
"off" in MXNet), ``wd`` and, for Adam, gradients about the size of ``epsilon``, where Adam's two
textbook forms differ (MXNet folds the bias correction into the step size and leaves epsilon
alone; ``m_hat / (sqrt(v_hat) + eps)`` does not): that case must match MXNet, and the other form
must not (so the comparison can tell them apart)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trainer_core.optim import local, server

PROG = Path(__file__).with_name("progs") / "mx_optim.py"
STEPS, N = 6, 48
DTYPES = ("float32", "float64")
# Two sets of hyperparameters: "exact" ones are float32 numbers (MXNet's operators take their
# parameters as C floats, so 0.999 becomes 0.99900001 there, and 1 - beta2 is off by 1.3e-5),
# "typical" ones are the usual defaults, where that rounding is part of the difference.
HYPER = {
    "exact": {"lr": 0.125, "mu": 0.875, "wd": 2.0**-10, "rescale": 0.5, "clip": 1.0,
              "alr": 2.0**-7, "b1": 0.875, "b2": 1 - 2.0**-10, "eps": 2.0**-27},
    "typical": {"lr": 0.1, "mu": 0.9, "wd": 1e-3, "rescale": 0.5, "clip": 1.0,
                "alr": 0.01, "b1": 0.9, "b2": 0.999, "eps": 1e-8},
}  # fmt: skip
# max |ours - MXNet| / max |MXNet| over the weights after each step (and the state arrays)
RTOL = {
    ("exact", "float64"): 1e-12,
    ("exact", "float32"): 1e-6,
    ("typical", "float64"): 1e-6,
    ("typical", "float32"): 1e-6,
}
#: float64 Adam: MXNet rounds its step size lr * sqrt(1 - b2^t) / (1 - b1^t) to a float32
ADAM_F64_RTOL = 1e-9


def cases(h: dict[str, float]) -> dict[str, tuple[str, dict[str, Any], tuple[Any, ...], float]]:
    """name: (MXNet optimizer, its kwargs, our front-end: ("server", type) or ("learner", name,
    kwargs), gradient scale)."""
    common = {"wd": h["wd"], "rescale_grad": h["rescale"], "clip_gradient": h["clip"]}
    sgd, mom = {"learning_rate": h["lr"]}, {"learning_rate": h["lr"], "momentum": h["mu"]}
    adam = {"learning_rate": h["alr"], "beta1": h["b1"], "beta2": h["b2"], "epsilon": h["eps"]}
    lmom = {"lr": h["lr"], "momentum": h["mu"]}
    ladam = {"lr": h["alr"], "beta1": h["b1"], "beta2": h["b2"], "eps": h["eps"]}
    wd = {"weight_decay": h["wd"]}
    return {
        "server-sgd": ("sgd", {**sgd, **common}, ("server", "sgd"), 1.0),
        "server-sgd-clip0": ("sgd", {**sgd, "clip_gradient": 0.0}, ("server", "sgd"), 1.0),
        "server-momentum": ("sgd", {**mom, **common}, ("server", "sgd"), 1.0),
        "server-nag": ("nag", {**mom, **common}, ("server", "nag"), 1.0),
        "server-adam": ("adam", {**adam, **common}, ("server", "adam"), 1.0),
        "server-adam-tiny": ("adam", adam, ("server", "adam"), h["eps"]),
        "learner-sgd": ("sgd", {**sgd, "wd": h["wd"]}, ("learner", "sgd", {"lr": h["lr"], **wd}), 1.0),
        "learner-momentum": ("sgd", {**mom, "wd": h["wd"]}, ("learner", "momentum", {**lmom, **wd}), 1.0),
        "learner-momentum-unit-gain": (
            "sgd",
            {**mom, "learning_rate": h["lr"] * (1 - h["mu"])},
            ("learner", "momentum", {**lmom, "unit_gain": True}),
            1.0,
        ),
        "learner-nesterov": ("nag", {**mom, "wd": h["wd"]}, ("learner", "nesterov", {**lmom, **wd}), 1.0),
        "learner-adam": ("adam", {**adam, "wd": h["wd"]}, ("learner", "adam", {**ladam, **wd}), 1.0),
        "learner-adam-tiny": ("adam", adam, ("learner", "adam", ladam), h["eps"]),
    }


CASES = {(hyper, name): case for hyper, h in HYPER.items() for name, case in cases(h).items()}
KEYS = [(hyper, name, dtype) for hyper, name in CASES for dtype in DTYPES]


def inputs(hyper: str, name: str, dtype: str) -> tuple[np.ndarray, list[np.ndarray]]:
    """A weight and STEPS gradients; a fifth of the gradient entries are 4x larger (clipped)."""
    rng = np.random.default_rng([sorted(CASES).index((hyper, name)), DTYPES.index(dtype)])
    scale = CASES[(hyper, name)][3]
    w = rng.standard_normal(N).astype(dtype)
    grads = [
        (scale * rng.standard_normal(N) * np.where(rng.random(N) < 0.2, 4.0, 1.0)).astype(dtype)
        for _ in range(STEPS)
    ]
    return w, grads


def ours(hyper: str, name: str, dtype: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Our weights after every step and our final state arrays (MXNet's order)."""
    _, mx_kwargs, front, _ = CASES[(hyper, name)]
    w, grads = inputs(hyper, name, dtype)
    steps = []
    if front[0] == "server":
        up = server.build({**mx_kwargs, "type": front[1]})
        state = up.create_state(w)
        for g in grads:
            up.update(w, g, state)
            steps.append(w.copy())
    else:
        learner = local.get_learner(front[1], {"w": w}, **front[2])
        for g in grads:
            learner.update({"w": g})
            steps.append(w.copy())
        state = learner.state.get("w", {})
    return steps, [state[k] for k in ("mom", "m", "v") if k in state]


@pytest.fixture(scope="module")
def mxnet_results(mxnet_python: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    runs = []
    for hyper, name, dtype in KEYS:
        w, grads = inputs(hyper, name, dtype)
        mx_name, mx_kwargs, _, _ = CASES[(hyper, name)]
        runs.append(
            {
                "optimizer": mx_name,
                "kwargs": mx_kwargs,
                "dtype": dtype,
                "weight": w.tolist(),
                "grads": [g.tolist() for g in grads],
            }
        )
    res = subprocess.run(
        [mxnet_python, str(PROG)], input=json.dumps(runs), capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return dict(zip(KEYS, json.loads(res.stdout.strip().splitlines()[-1]), strict=True))


def rel_diff(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max |b| (the arrays' scale; entries near zero do not blow it up)."""
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


@pytest.mark.parametrize(("hyper", "name", "dtype"), KEYS)
def test_matches_mxnet_step_by_step(hyper: str, name: str, dtype: str, mxnet_results: dict) -> None:
    theirs = mxnet_results[(hyper, name, dtype)]
    steps, arrays = ours(hyper, name, dtype)
    rtol = RTOL[(hyper, dtype)]
    if dtype == "float64" and "adam" in name:
        rtol = max(rtol, ADAM_F64_RTOL)
    start = inputs(hyper, name, dtype)[0]
    assert len(theirs["steps"]) == len(steps) == STEPS
    for t, (got, want) in enumerate(zip(steps, theirs["steps"], strict=True), start=1):
        want = np.array(want, dtype)
        assert rel_diff(want, start) > 100 * rtol  # the step moved the weight well beyond rtol
        assert rel_diff(got, want) <= rtol, f"step {t}: {rel_diff(got, want):.3g}"
    assert len(arrays) == len(theirs["state"])
    for got, want in zip(arrays, theirs["state"], strict=True):
        # Adam's v under "typical": MXNet's 1 - beta2 is 1 - float32(0.999), off by 1.3e-5
        tol = 2e-5 if hyper == "typical" and "adam" in name else rtol
        assert rel_diff(got, np.array(want, dtype)) <= tol


def test_the_other_adam_form_would_not_match(mxnet_results: dict) -> None:
    """``m_hat / (sqrt(v_hat) + eps)`` on the tiny-gradient case is far from MXNet: the comparison
    above does tell the two epsilon placements apart."""
    h = HYPER["exact"]
    w, grads = inputs("exact", "server-adam-tiny", "float64")
    start = w.copy()
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        m = h["b1"] * m + (1 - h["b1"]) * g
        v = h["b2"] * v + (1 - h["b2"]) * g * g
        w = w - h["alr"] * (m / (1 - h["b1"] ** t)) / (np.sqrt(v / (1 - h["b2"] ** t)) + h["eps"])
    want = np.array(mxnet_results[("exact", "server-adam-tiny", "float64")]["steps"][-1])
    assert rel_diff(w - start, want - start) > 0.1


KV_CASES = {
    "sgd": {"learning_rate": 0.1, **{"wd": 1e-3, "rescale_grad": 0.5, "clip_gradient": 1.0}},
    "nag": {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3, "rescale_grad": 0.5},
    "adam": {"learning_rate": 0.01, "wd": 1e-3, "clip_gradient": 1.0},
}


def test_local_kv_store_with_an_optimizer_matches_mxnets(mxnet_python: str) -> None:
    """Through the KV API: ``set_optimizer``, ``init``, pushes of two values per key (summed before
    the optimizer), pulls; our ``local`` store (the server's store) against MXNet's."""
    from trainer_core import kv as kvstore

    rng = np.random.default_rng(7)
    runs = []
    for name, kwargs in KV_CASES.items():
        w = rng.standard_normal(N).astype(np.float32)
        pushes = [[rng.standard_normal(N).astype(np.float32) for _ in range(2)] for _ in range(STEPS)]
        runs.append((name, kwargs, w, pushes))
    payload = [
        {"optimizer": n, "kwargs": k, "weight": w.tolist(), "pushes": [[v.tolist() for v in p] for p in ps]}
        for n, k, w, ps in runs
    ]
    res = subprocess.run(
        [mxnet_python, str(PROG.with_name("mx_kv_optim.py"))],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    theirs = json.loads(res.stdout.strip().splitlines()[-1])
    for (name, kwargs, w, pushes), want_steps in zip(runs, theirs, strict=True):
        store = kvstore.create("local")
        store.set_optimizer(name, **kwargs)
        store.init(3, w)
        for t, (values, want) in enumerate(zip(pushes, want_steps, strict=True), start=1):
            store.push(3, values)
            got = np.empty(N, np.float32)
            store.pull(3, got)
            want = np.array(want, np.float32)
            assert rel_diff(want, w) > 1e-4, name  # the optimizer did move the value
            assert rel_diff(got, want) <= 1e-6, f"{name} step {t}: {rel_diff(got, want):.3g}"
