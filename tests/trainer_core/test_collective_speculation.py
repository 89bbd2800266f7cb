"""The speculative allreduce's pieces in one process (collective/speculation.py): the data moves
while the ranks' records are compared; a difference found after it, or by a long wait during it,
or a data path that failed because of it, drops the operation's messages and settles the slot as
a disagreement; a failure with agreeing records is the group's. The real thing, among worker
processes with an algorithm forced off the segment: test_collective_agreement_jobs.py."""

from __future__ import annotations

import pytest

from trainer_core.collective import speculation
from trainer_core.collective.agreement import record
from trainer_core.collective.primitives import stall
from trainer_core.collective.primitives.links import SEQ_WRAP, Ctx, LinkError, data_op, op_bits

SAME, OTHER = record("grad.1", b"x" * 16, 64), record("grad.2", b"x" * 16, 64)


class FakeExchange:
    local = object()

    def __init__(self, records: list[bytes], shown_early: bool = True) -> None:
        self.records, self.shown_early = records, shown_early
        self.log: list[str] = []

    def show(self, rec: bytes) -> int:
        self.log.append("show")
        return 9

    def shown(self, base: int) -> list[bytes] | None:
        return self.records if self.shown_early else None

    def records_at(self, base: int) -> list[bytes]:
        self.log.append(f"records_at {base}")
        return self.records


class FakeLinks:
    size = 2

    def __init__(self) -> None:
        self.dropped: list[int] = []

    def drop(self, seq: int) -> None:
        self.dropped.append(seq)


def test_data_tags_are_told_from_control_tags_by_operation() -> None:
    ctx = Ctx.for_op(FakeLinks(), 5)  # type: ignore[arg-type]
    assert data_op(ctx.tag(0)) == 5 and data_op(ctx.phase(2).phase(0).tag(9, 3)) == 5
    assert data_op(ctx.control(0)) is None and data_op(ctx.control(3)) is None
    assert op_bits(5 + SEQ_WRAP) == 5 and data_op(Ctx.for_op(FakeLinks(), 5 + SEQ_WRAP).tag(1)) == 5  # type: ignore[arg-type]


def test_agreeing_records_keep_what_the_data_path_did() -> None:
    ex, links, ran = FakeExchange([SAME, SAME]), FakeLinks(), []
    assert speculation.run(ex, links, 4, SAME, lambda: ran.append(1)) == [SAME, SAME]  # type: ignore[arg-type]
    assert ran == [1] and links.dropped == [] and ex.log == ["show", "records_at 9"]


def test_records_that_differ_after_the_data_moved_drop_it() -> None:
    ex, links = FakeExchange([SAME, OTHER]), FakeLinks()
    assert speculation.run(ex, links, 4, SAME, lambda: None) == [SAME, OTHER]  # type: ignore[arg-type]
    assert links.dropped == [4]


def test_a_long_wait_ends_when_the_records_turn_out_to_differ() -> None:
    """The data path waits for a message a rank in another operation never sends: its wait's
    check (``stall.watched``, between 0.1 s slices) ends it."""
    ex, links = FakeExchange([SAME, OTHER]), FakeLinks()

    def waits_forever() -> None:
        for _ in range(1000):
            stall.watched()
        raise AssertionError("the wait was not ended")

    assert speculation.run(ex, links, 6, SAME, waits_forever) == [SAME, OTHER]  # type: ignore[arg-type]
    assert links.dropped == [6]
    stall.watched()  # the check is gone with the operation


def test_a_wait_goes_on_while_a_rank_has_not_shown_its_record() -> None:
    ex, links, checks = FakeExchange([SAME, OTHER], shown_early=False), FakeLinks(), []

    def waits() -> None:
        for _ in range(3):
            stall.watched()
            checks.append(1)

    assert speculation.run(ex, links, 6, SAME, waits) == [SAME, OTHER]  # type: ignore[arg-type]
    assert checks == [1, 1, 1] and links.dropped == [6]


def test_a_failed_data_path_is_a_disagreement_only_where_the_records_differ() -> None:
    def wrong_length() -> None:
        raise LinkError("collective: rank 1 sent 20 bytes to rank 0, which expected 16", 1)

    links = FakeLinks()
    assert speculation.run(FakeExchange([SAME, OTHER]), links, 3, SAME, wrong_length) == [SAME, OTHER]  # type: ignore[arg-type]
    assert links.dropped == [3]
    with pytest.raises(LinkError, match="expected 16"):  # they agree: the group's failure
        speculation.run(FakeExchange([SAME, SAME]), links, 4, SAME, wrong_length)  # type: ignore[arg-type]
    assert links.dropped == [3]


def test_it_takes_one_host_and_links_that_can_drop() -> None:
    assert speculation.takes(FakeExchange([]), FakeLinks())  # type: ignore[arg-type]
    plain = type("Plain", (), {"size": 2})()
    assert not speculation.takes(FakeExchange([]), plain)  # type: ignore[arg-type]
    nohost = FakeExchange([])
    nohost.local = None  # type: ignore[assignment]
    assert not speculation.takes(nohost, FakeLinks())  # type: ignore[arg-type]
