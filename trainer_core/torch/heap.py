"""Gradients that stay in the C heap between steps.

With ``zero_grad(set_to_none=True)`` (torch's default) every step frees the gradients and the next
backward pass allocates them again. glibc's malloc serves a block above its mmap threshold with a
fresh mapping, and returns the top of its heap to the system when more than its trim threshold is
free there; both thresholds start small (128 KiB) and grow only when a mapped block is freed (to
that block's size, and twice that). A model whose gradients add up to more than twice its largest
one thus has them unmapped (or trimmed) at every ``zero_grad`` and faulted in again, page by page,
at every backward pass: at 4.2M float32 parameters about 3 ms of one core per step, and whether a
job pays it depended on which large buffer the process had happened to free before.

``keep_in_heap(nbytes)`` frees one untouched block of the gradients' total size (at most glibc's
32 MiB cap on the threshold): glibc's own rule then sets the thresholds from it, so the gradients
are allocated from the heap and stay there. The block is never written (mapped and unmapped, no
page faulted in); on another C library it is just a short-lived empty tensor.
"""

from __future__ import annotations

import torch

#: glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: a freed block larger than this moves no threshold
MMAP_THRESHOLD_MAX = 32 * 2**20
_MARGIN = 2**20  # above the gradients' bytes: their allocations' headers and alignment


def keep_in_heap(nbytes: int) -> int:
    """Raise malloc's thresholds to hold ``nbytes`` of tensors that are freed and allocated again
    together; returns the size of the block freed (0: nothing to do)."""
    if nbytes <= 0:
        return 0
    size = min(nbytes + _MARGIN, MMAP_THRESHOLD_MAX)
    block = torch.empty(size, dtype=torch.uint8)
    del block
    return size
