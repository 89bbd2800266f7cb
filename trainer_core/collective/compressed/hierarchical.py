"""The compressed allreduce with several ranks per host (``Group.compressed_allreduce`` on a
topology where some host has several ranks and there are several hosts).

1. The host's ranks sum their arrays in full precision: through the host's shared-memory segment
   (``shmreduce``) where there is one, else a tree on the links (``hierarchical``); with two ranks
   in a segment, where the compressor ``encodes_sum``, the leader's encoder reads its input and
   the other's slot and adds them itself (the same bits; the sum is never written);
2. only the hosts' leaders run the two-stage compressed allreduce (``twostage.allreduce``) on
   their host's sum, with the leader's error feedback (its ``KeyState``, one compressor per host's
   chunk: the residual is of the host's sum, the other ranks' state is never used); ``mean``
   divides by the whole group's size before the second stage;
3. the leader's result goes back to its host's ranks: through shared memory as the leaders'
   stage-two payloads, which every rank decodes, the leader too, once it has shared them (about
   1/32 of the bytes of the result at 1 bit; bit-identical everywhere), else copied.

Only the leaders encode and decode, and one compressed payload per host crosses the links.
"""

from __future__ import annotations

import numpy as np

from .. import policy
from ..algorithms import hierarchical, shmreduce
from ..algorithms.hierarchical import Topology
from ..primitives.hostsegment import Local
from ..primitives.links import Ctx, SubLinks
from ..primitives.reduce import ReduceSpec, spec_for
from . import twostage


def takes(topo: Topology | None) -> bool:
    """Whether the compressed allreduce runs hierarchically on ``topo``."""
    return topo is not None and topo.nhosts > 1 and topo.max_local > 1


def allreduce(
    ctx: Ctx,
    x: np.ndarray,
    spec: ReduceSpec,
    st: twostage.KeyState,
    topo: Topology,
    loc: Local | None,
    th: policy.Thresholds,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """The compressed reduction of every rank's flat ``x``: into ``out`` (flat, ``x``'s dtype and
    size; may be ``x`` itself, else ``x`` is not modified), else a fresh array."""
    out = np.empty_like(x) if out is None else out
    if x.size == 0:
        return out
    total = spec_for(x.dtype, "sum")

    def cross(c: Ctx, buf: np.ndarray, _sum: ReduceSpec, keep: dict[int, np.ndarray] | None = None) -> None:
        twostage.allreduce(c, buf, spec, st, count=ctx.size, out=buf, keep=keep)  # the leaders, in place

    if loc is not None:
        leaders = topo.leaders()
        # two ranks: the leader sums the host alone (its input in place, the other's from its slot),
        # which costs a third less CPU than splitting the sum (each rank's result block copied
        # through the slots); with more, the split shares the additions out
        split = loc.size > 2 and policy.shm_split(x.nbytes, loc.size, th)

        def on() -> Ctx:  # (only the leaders are members of the leaders' links)
            return ctx.phase(1).on(SubLinks(ctx.links, leaders))

        def on_leaders(buf: np.ndarray) -> np.ndarray:  # the host's other ranks decode the payloads
            keep: dict[int, np.ndarray] = {}
            twostage.allreduce(on(), buf, spec, st, count=ctx.size, out=buf, keep=keep, decode=False)
            return twostage.publish(keep, ctx)

        def on_leaders_sum(mine: np.ndarray, other: np.ndarray, buf: np.ndarray) -> np.ndarray:
            keep: dict[int, np.ndarray] = {}
            twostage.allreduce(
                on(), mine, spec, st, count=ctx.size, out=buf, keep=keep, plus=other, decode=False
            )
            return twostage.publish(keep, ctx)

        nhosts = len(leaders)
        # where the compressor encodes a sum of two without forming it, the leader of two ranks
        # never writes the host's sum: its stage one encodes its input plus the other's slot
        fused = on_leaders_sum if st.workers[0].encodes_sum(x) else None
        shmreduce.allreduce(
            loc,
            x,
            out,
            total,
            split,
            on_leaders,
            lambda form, o: twostage.expand(form, o, nhosts),
            cross_sum=fused,
        )
    else:
        np.copyto(out, x)
        hierarchical.allreduce(ctx, out, total, topo, cross)
    return out
