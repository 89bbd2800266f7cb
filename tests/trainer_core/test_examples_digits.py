"""examples/digits.py: scikit-learn's digits and its stratified split, read and made without
importing scikit-learn, equal to ``load_digits`` and ``train_test_split`` (the examples trained on
those before; their tests' accuracies and the unbroken runs they compare with stay the same)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from tests.available import skip_without
from tests.trainer_core.markedjob import REPO

skip_without("sklearn")


def example(name: str) -> Any:
    """``examples/NAME.py`` as a module (the examples' folder is no package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


digits = example("digits")


@pytest.mark.parametrize("seed", [0, 1, 2, 7, 1234])
def test_the_split_is_scikit_learns(seed: int) -> None:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x_tr, x_te, y_tr, y_te = train_test_split(
        data.data, data.target, test_size=0.25, random_state=seed, stratify=data.target
    )
    want = (x_tr, y_tr, x_te, y_te)  # the examples' order
    got = digits.load(seed)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize(
    ("counts", "draws", "seed"), [([4, 2], 3, 0), ([5, 2], 4, 0), ([2, 2, 2, 1], 2, 0), ([2, 2, 2, 1], 2, 42)]
)
def test_the_counts_drawn_per_class_are_scikit_learns(counts: list[int], draws: int, seed: int) -> None:
    from sklearn.utils.extmath import _approximate_mode

    want = _approximate_mode(np.array(counts), draws, np.random.RandomState(seed))
    got = digits.approximate_mode(np.array(counts), draws, np.random.RandomState(seed))
    assert got.tolist() == want.tolist()


def test_the_examples_do_not_import_scikit_learn() -> None:
    code = "import sys, digits; digits.load(0); print('sklearn' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO / "examples", capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


def test_train_digits_loads_what_it_loaded_through_scikit_learn(monkeypatch: pytest.MonkeyPatch) -> None:
    """The example's arrays, bit for bit, as its former scikit-learn code made them."""
    monkeypatch.syspath_prepend(str(REPO / "examples"))  # as when it runs: its folder on the path
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    train_digits = example("train_digits")
    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.25, random_state=3, stratify=y)
    for got, want in zip(train_digits.load_digits(3), (x_tr, y_tr, x_te, y_te), strict=True):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
