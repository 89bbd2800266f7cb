"""trainer_core.torch.heap: a model's gradients, freed and allocated again every step, stay in the
C heap (no page faulted in again) once ``keep_in_heap`` ran; without it glibc unmaps them."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="trainer_core.torch needs torch (the torch extra)")

from trainer_core.torch import heap

MEASURED = 20  # steps measured, after 3 of warm-up
# a step's gradients as the 4.2M-parameter MLP of bench/torch_step.py has them (8 MiB, 8 MiB and
# small ones), allocated and written by "backward", freed by "zero_grad"; prints the page faults
# of each measured step. "keep": keep_in_heap first. "pinned": glibc's starting thresholds (128 KiB)
# held there (mallopt turns their growth off), whatever the interpreter's start freed before
STEPS = r"""
import ctypes, json, resource, sys, torch
from trainer_core.torch import heap
shapes = [(2048, 1024), (2048,), (1024, 2048), (1024,), (10, 1024), (10,)]
if sys.argv[1] == "keep":
    heap.keep_in_heap(sum(4 * torch.Size(s).numel() for s in shapes))
else:
    libc = ctypes.CDLL(None)
    assert libc.mallopt(-3, 128 * 1024) and libc.mallopt(-1, 128 * 1024)  # M_MMAP_, M_TRIM_THRESHOLD
def step():
    grads = [torch.ones(s) for s in shapes]
    del grads
for _ in range(3):
    step()
faults = []
for _ in range(int(sys.argv[2])):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(faults))
"""


def test_the_block_freed_is_the_gradients_size_capped_at_glibcs_limit() -> None:
    assert heap.keep_in_heap(0) == 0
    assert heap.keep_in_heap(16 * 2**20) == 17 * 2**20
    assert heap.keep_in_heap(10**10) == heap.MMAP_THRESHOLD_MAX


def _faults(mode: str) -> list[int]:
    """The page faults of each measured step, in a new interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", STEPS, mode, str(MEASURED)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the thresholds are glibc's malloc's")
def test_gradients_freed_each_step_are_not_faulted_in_again() -> None:
    gradient = 8 * 2**20 // 4096  # the pages of one 8 MiB gradient
    # glibc at its starting thresholds: both gradients unmapped and faulted in again, every step
    pinned = _faults("pinned")
    assert all(f >= 2 * gradient for f in pinned), pinned
    # with the block freed: the gradients stay in the heap, no page faulted in again step after step.
    # The heap may still grow to its high-water mark in a measured step, once or twice: a gradient
    # placed above the old top, its pages touched for the first time (an interpreter whose earlier
    # frees left a hole below the top: a 1 MB block freed under a live small one showed one
    # gradient's 2,048 pages after the 3 steps of warm-up)
    kept = _faults("keep")
    assert sum(f >= gradient // 2 for f in kept) <= 2 and sum(kept) < 3 * gradient, kept
