"""Allreduce among the ranks of one host through their shared-memory segment (``hostsegment``), and the
host's part of the hierarchical allreduce.

Operation ``k`` of a host's ranks uses steps ``3k+1..3k+3`` of their counters:

1. every rank waits until all posted ``3k`` (they finished reading operation ``k - 1``, so the
   slots are free), copies its input into its slot and posts ``3k+1``;
2. ``split``: local rank ``r`` reduces block ``r`` of every slot (``ring.blocks``), slots in rank
   order, ``((x0 op x1) op x2) ...``, writes it into block ``r`` of its own slot (only it reads
   that block) and posts ``3k+2``; everyone waits for all, and copies every rank's block from its
   slot into the output. (Where the output is not the input, a rank's own block skips the slot:
   it is read from the input and reduced into the output, then copied into the slot for the
   others.) Not ``split`` (small buffers: one step less): every rank reduces the
   whole buffer itself, in the same order, into its output;
3. every rank posts ``3k+3`` once it has read what it needs.

Each element is reduced in one fixed order from the same bits on every rank (or by one rank and
copied): the results are bit-identical. With ``cross`` (several hosts), only local rank 0 (the
leader) assembles the host's reduction, runs ``cross`` on it (the leaders' allreduce), writes the
result into its slot and posts ``3k+3``; the others wait for that and copy it out. Where ``cross``
returns the result in a smaller form (the compressed allreduce: its payloads) and ``expand`` turns
that form into the result, the leader writes that form instead, notes its length (``Local.note``),
posts ``3k+3`` and only then ``expand``s it into its own output, while the others do the same:
about 1 MB read and decoded instead of a 40 MB copy at 1e7 float32 at 1 bit, the same bytes
through the same code on every rank, so bit-identical. As only the
leader reads the slots' blocks then, its own block is not copied into its slot; not ``split``,
only the leader reduces, reading its own input in place (the others copy theirs to their slots).
With two ranks and ``cross_sum`` (the compressed allreduce, whose 1-bit encoder reads a sum of two
without writing it), the leader does not form the host's sum at all: ``cross_sum`` gets its input
and the other rank's slot, which the other rank fills with non-temporal stores
(``compression.kernels.copy_streaming``: only the leader's encoder reads it, once, so it is not
kept in the writer's cache, and memory sees half the traffic of a plain copy).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from trainer_core.compression.kernels import copy_streaming

from ..primitives.hostsegment import Local
from ..primitives.reduce import ReduceSpec
from .ring import blocks


def allreduce(
    loc: Local,
    x: np.ndarray,
    out: np.ndarray,
    spec: ReduceSpec,
    split: bool,
    cross: Callable[[np.ndarray], np.ndarray | None] | None = None,
    expand: Callable[[np.ndarray, np.ndarray], None] | None = None,
    show: Callable[[], None] | None = None,
    agreed: Callable[[], bool] | None = None,
    cross_sum: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray | None] | None = None,
) -> bool:
    """``out`` (flat, ``x``'s dtype and size; may be ``x`` itself) becomes the reduction of every
    local rank's flat ``x``, then (``cross``) over the hosts; ``expand(form, out)``: writes into
    ``out`` the result from the uint8 ``form`` that ``cross`` returned (None: the result itself
    goes through the slot; with ``expand``, ``cross`` leaves ``out`` alone and the leader
    expands the form too, after it shared it). ``show`` runs before this rank posts its first step (it shows the
    operation's record beside its counter) and ``agreed`` once every rank posted it: False ends the
    operation there (every rank sees the same records, so every rank ends it) and returns False.
    ``cross_sum(x, other, out)``, with two local ranks and not ``split``: the leader leaves the
    host's sum to it (``x + other``, ``other`` the other rank's slot, ``spec``'s sum of two), and
    it does what ``cross`` would on that sum, into ``out``, never writing the sum itself."""
    base, slots = loc.begin(x, 1)
    me, size = loc.rank, loc.size
    bounds = blocks(x.size, size)
    a, b = bounds[me]
    # split, with ``out`` apart from ``x``: this rank's own block is read from ``x`` and reduced
    # straight into ``out`` (only the other blocks go through the slot on the way in or out)
    direct = split and not np.may_share_memory(x, out)
    # with ``cross`` and not ``split``, only the leader reduces, reading its own ``x`` in place
    alone = cross is not None and not split
    # ... and with two, ``cross_sum`` takes the two inputs instead of their sum
    fused = alone and size == 2 and cross_sum is not None
    if direct:
        np.copyto(slots[me][:a], x[:a])
        np.copyto(slots[me][b:], x[b:])
    elif not (alone and me == 0):
        # fused, only the leader's encoder reads it, once: not worth this core's cache (and the
        # compressed path's kernels are loaded already, the 32-bit path imports no numba)
        (copy_streaming if fused else np.copyto)(slots[me], x)
    if show is not None:
        show()
    loc.post(base + 1)
    loc.wait_all(base + 1, "write its input")
    if agreed is not None and not agreed():
        loc.post(base + 3)
        return False
    if not split:
        if (cross is None or me == 0) and not fused:
            _reduce(spec, [x, *slots[1:]] if alone else slots, out)
    else:
        parts = [x[a:b] if direct and r == me else s[a:b] for r, s in enumerate(slots)]
        if direct:
            _reduce(spec, parts, out[a:b])
            if cross is None or me != 0:  # (the leader's own block: only it assembles the sum)
                np.copyto(slots[me][a:b], out[a:b])
        else:
            _reduce(spec, parts, slots[me][a:b], out[a:b])
        loc.post(base + 2)
        loc.wait_all(base + 2, "reduce its block")
        if cross is None or me == 0:
            for r, (ra, rb) in enumerate(bounds):
                if not (direct and r == me):
                    np.copyto(out[ra:rb], slots[r][ra:rb])
    if cross is not None:
        if me == 0:
            form = cross_sum(x, slots[1], out) if fused and cross_sum is not None else cross(out)
            if form is not None and expand is not None:
                if 0 < form.nbytes <= x.nbytes:  # shared first: the host's ranks expand it at once
                    np.copyto(loc.segment.slot(0, form.dtype, form.size), form)
                    loc.note(form.nbytes)
                    loc.post(base + 3)
                    expand(form, out)
                    return True
                expand(form, out)
            np.copyto(slots[0], out)
            loc.note(0)
        else:
            loc.wait_for(0, base + 3, "bring the other hosts' result")
            n = loc.noted(0)
            if n and expand is not None:
                expand(loc.segment.slot(0, np.dtype(np.uint8), n), out)
            else:
                np.copyto(out, slots[0])
    loc.post(base + 3)
    return True


def _reduce(
    spec: ReduceSpec, parts: list[np.ndarray], dest: np.ndarray, scratch: np.ndarray | None = None
) -> None:
    """``dest = ((parts[0] op parts[1]) op parts[2]) ...``; ``dest`` may be one of the parts only
    where it is read no later than it is written (the first two, or the last); ``scratch`` (or
    ``dest``) holds the partial results."""
    if len(parts) == 1:
        np.copyto(dest, parts[0])
        return
    acc = dest if scratch is None else scratch
    if len(parts) == 2:
        spec.combine(parts[0], parts[1], dest)
        return
    spec.combine(parts[0], parts[1], acc)
    for p in parts[2:-1]:
        spec.combine(acc, p, acc)
    spec.combine(acc, parts[-1], dest)
