"""trainer_core.torch.heap: a model's gradients, freed and allocated again every step, stay in the
C heap (no page faulted in again) once ``keep_in_heap`` ran; without it glibc unmaps them."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="trainer_core.torch needs torch (the torch extra)")

from trainer_core.torch import heap

# a step's gradients as the 4.2M-parameter MLP of bench/torch_step.py has them (8 MiB, 8 MiB and
# small ones), allocated and written by "backward", freed by "zero_grad"; prints the page faults
# of the last 5 steps
STEPS = r"""
import resource, sys, torch
from trainer_core.torch import heap
shapes = [(2048, 1024), (2048,), (1024, 2048), (1024,), (10, 1024), (10,)]
if sys.argv[1] == "keep":
    heap.keep_in_heap(sum(4 * torch.Size(s).numel() for s in shapes))
def step():
    grads = [torch.ones(s) for s in shapes]
    del grads
for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_the_block_freed_is_the_gradients_size_capped_at_glibcs_limit() -> None:
    assert heap.keep_in_heap(0) == 0
    assert heap.keep_in_heap(16 * 2**20) == 17 * 2**20
    assert heap.keep_in_heap(10**10) == heap.MMAP_THRESHOLD_MAX


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", STEPS, mode], capture_output=True, text=True, check=True)
    return int(out.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the thresholds are glibc's malloc's")
def test_gradients_freed_each_step_are_not_faulted_in_again() -> None:
    gradient = 8 * 2**20 // 4096  # the pages of one 8 MiB gradient
    # with the block freed: the gradients stay in the heap, whatever the interpreter's start did
    assert _faults("keep") < gradient // 10
    # glibc alone: unmapped and faulted in again (every step both, 20,320 pages in 5 steps, or one
    # of them once, 2,048), except where the interpreter's start happened to free a large block,
    # which grows glibc's thresholds as the fix does (a fresh machine's run saw 10 pages): there
    # this control shows nothing, and is not asked for
    plain = _faults("plain")
    assert plain >= gradient or plain < gradient // 10
