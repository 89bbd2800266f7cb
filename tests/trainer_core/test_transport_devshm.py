"""Shared memory that does not fit (transport/devshm.py ``map_shared``): under an address-space limit a
mapping is a ``MemoryError`` naming its size, what it was for, the limit and what to do, not a bare
``OSError [Errno 12]``; for the KV store's segments and buffers and the collective's slots alike."""

from __future__ import annotations

import subprocess
import sys

from tests.trainer_core.cluster import REPO

# run under RLIMIT_AS = what the interpreter holds now + 256 MiB: the 4 GiB mappings cannot fit
UNDER_A_LIMIT = """
import resource, sys
from trainer_core.collective.primitives.hostsegment import Segment as Slots
from trainer_core.transport.devshm import MemBuffer, SegmentFactory
with open('/proc/self/statm') as f:
    held = int(f.read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (held + (256 << 20), resource.getrlimit(resource.RLIMIT_AS)[1]))
for name, make in [
    ('buffer', lambda: MemBuffer(4 << 30)),
    ('segment', lambda: SegmentFactory('shmtest' + str(__import__('os').getpid()), 'w0').create(4 << 30)),
    ('slots', lambda: Slots.create(2).ensure(2 << 30)),
]:
    try:
        make()
    except MemoryError as exc:
        print(name, 'MemoryError', exc)
    else:
        print(name, 'mapped')
"""


def test_a_mapping_that_does_not_fit_says_its_size_and_the_limit() -> None:
    done = subprocess.run(
        [sys.executable, "-c", UNDER_A_LIMIT],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[:2] for line in lines] == [
        [n, "MemoryError"] for n in ("buffer", "segment", "slots")
    ], done.stdout + done.stderr
    buffer, segment, slots = lines
    assert "cannot map 4.00 GiB (4294967296 bytes) of shared memory for a key's shared buffer" in buffer
    assert "for segment launchkit-shmtest" in segment
    assert "for the host's collective slots (2 local ranks x 2147483648 bytes)" in slots
    for line in lines:
        assert "this process's address-space limit, ulimit -v, is " in line and " GiB, and shared" in line
        assert line.endswith("raise that limit, or exchange smaller arrays per call")
