"""scikit-learn's bundled digits (1,797 8x8 images), split into a training set and a test set of
a quarter, stratified by digit, exactly as ``sklearn.model_selection.train_test_split(x, y,
test_size=0.25, random_state=seed, stratify=y)`` splits them, without importing scikit-learn:
its import (scipy.stats with it) costs about a second of CPU in every worker of a job. The data
file is scikit-learn's own, so scikit-learn must be installed. The examples import this module
from their own folder; ``tests/trainer_core/test_examples_digits.py`` checks it against
scikit-learn's ``load_digits`` and ``train_test_split``."""

from __future__ import annotations

import gzip
import importlib.util
import math
from pathlib import Path

import numpy as np

TEST_SIZE = 0.25


def data_file() -> Path:
    """``digits.csv.gz`` of the installed scikit-learn (found without importing it)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the digits come with scikit-learn: pip install scikit-learn")
    return Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"


def approximate_mode(counts: np.ndarray, draws: int, rng: np.random.RandomState) -> np.ndarray:
    """How many of each class ``draws`` takes (scikit-learn's ``_approximate_mode``: the floor of
    each class's share, then one more to the largest remainders, ties drawn with ``rng``)."""
    continuous = counts / counts.sum() * draws
    floored = np.floor(continuous)
    need = int(draws - floored.sum())
    if need > 0:
        remainder = continuous - floored
        for value in np.sort(np.unique(remainder))[::-1]:
            (inds,) = np.where(remainder == value)
            now = min(len(inds), need)
            floored[rng.choice(inds, size=now, replace=False)] += 1
            need -= now
            if need == 0:
                break
    return floored.astype(int)


def stratified_split(y: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The training and test indices (scikit-learn's ``StratifiedShuffleSplit``, one split)."""
    n_test = math.ceil(TEST_SIZE * len(y))
    n_train = len(y) - n_test
    _, inverse, counts = np.unique(y, return_inverse=True, return_counts=True)
    members = np.split(np.argsort(inverse, kind="stable"), np.cumsum(counts)[:-1])
    rng = np.random.RandomState(seed)
    n_i = approximate_mode(counts, n_train, rng)
    t_i = approximate_mode(counts - n_i, n_test, rng)
    train: list[int] = []
    test: list[int] = []
    for i, idx in enumerate(members):
        shuffled = idx.take(rng.permutation(counts[i]), mode="clip")
        train.extend(shuffled[: n_i[i]])
        test.extend(shuffled[n_i[i] : n_i[i] + t_i[i]])
    return rng.permutation(train), rng.permutation(test)


def load(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(x_train, y_train, x_test, y_test)``: pixels 0-16 as float64 (64 per image), digits as
    int64."""
    with gzip.open(data_file(), "rt") as f:
        data = np.loadtxt(f, delimiter=",")
    x, y = data[:, :-1], data[:, -1].astype(np.int64)
    train, test = stratified_split(y, seed)
    return x[train], y[train], x[test], y[test]
