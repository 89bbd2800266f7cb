"""The merged output feeds each process's tail (launchkit.merger): the tail keeps the last lines
only, yet it must see a node's ``dmlc_env`` line (the node ends because another failed) however far
back in one read it came, or the root cause is misjudged (launchkit.rootcause.Tail)."""

from __future__ import annotations

import io
import os
import threading

from dmlc_env.ending import peer_failed_line
from launchkit.console import OutputWriter
from launchkit.merger import Merger
from launchkit.rootcause import Tail, peer_of


def _feed_at_once(data: bytes, tail_lines: int = 20) -> Tail:
    """``data`` written into one pipe in one write (so the merger reads it as one chunk)."""
    merger = Merger(OutputWriter(io.BytesIO(), io.BytesIO()), tail_lines=tail_lines)
    r, w = os.pipe()
    tail = Tail(tail_lines)
    merger.add(os.fdopen(r, "rb"), "err", b"[worker 0] ", tail)
    merger.start()
    writer = threading.Thread(target=lambda: (os.write(w, data), os.close(w)))
    writer.start()
    assert merger.drain(30.0)
    merger.close()
    writer.join()
    return tail


def test_a_peer_failure_line_far_back_in_one_chunk_is_seen() -> None:
    """The line, then a traceback longer than the tail: the case of a worker refused at start-up."""
    traceback = [f"  frame {i}" for i in range(30)]
    data = "\n".join([peer_failed_line("worker 1"), "Traceback (most recent call last):", *traceback, ""])
    tail = _feed_at_once(data.encode())
    peer = peer_of(tail)
    assert peer is not None and (peer.role, peer.rank) == ("worker", 1)
    assert list(tail) == traceback[-20:]  # the tail itself still keeps the last lines only


def test_a_chunk_without_the_line_leaves_the_tail_as_it_was() -> None:
    lines = [f"line {i}" for i in range(50)]
    tail = _feed_at_once(("\n".join(lines) + "\n").encode())
    assert peer_of(tail) is None and list(tail) == lines[-20:]
