"""Adasum's reference for the tests, written out from its definition (not from
``trainer_core.torch.folded``): pairs at distance 1, then 2, 4, ... in rank order, and the
parameters after one step of Horovod's Adasum optimizer among some ranks."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tests.trainer_core.torch_hvdjob import adasum_input, adasum_model


def adasum_reference(rows: list[list[float]]) -> list[float]:
    """Adasum of ``rows`` (one per rank, in rank order; a power of two of them)."""

    def pair(a: list[float], b: list[float]) -> list[float]:
        dot = sum(x * y for x, y in zip(a, b, strict=True))
        na, nb = sum(x * x for x in a), sum(y * y for y in b)
        ca = 1 - dot / (2 * na) if na >= 1e-8 else 1.0
        cb = 1 - dot / (2 * nb) if nb >= 1e-8 else 1.0
        return [ca * x + cb * y for x, y in zip(a, b, strict=True)]

    while len(rows) > 1:
        rows = [pair(rows[i], rows[i + 1]) for i in range(0, len(rows), 2)]
    return rows[0]


def adasum_step(ranks: Sequence[int]) -> np.ndarray:
    """The parameters after one SGD step of Horovod's Adasum optimizer among ``ranks``: each rank's
    own update (lr 0.1 on its own input, ``adasum_input``), combined with Adasum per parameter in
    the ranks' order, added to the start."""
    import torch

    start = [p.detach().reshape(-1).numpy().copy() for p in adasum_model().parameters()]
    updates: list[list[np.ndarray]] = []
    for r in ranks:
        model = adasum_model()
        model(torch.from_numpy(adasum_input(r))).pow(2).sum().backward()
        updates.append([-0.1 * p.grad.reshape(-1).numpy() for p in model.parameters()])
    combined = [adasum_reference([u[i].tolist() for u in updates]) for i in range(len(start))]
    return np.concatenate([s + np.array(c) for s, c in zip(start, combined, strict=True)])
