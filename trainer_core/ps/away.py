"""The workers that are in a collective call at the scheduler, as a server sees them, and the sync
requests that can never complete because of it (pure; ``store.Store`` applies what it finds).

A worker about to enter a collective call (a barrier, an agreement) has every request of its own
answered, then tells every server (op ``away``) and waits for their replies: from then on it
pushes nothing until the call completes, which needs every worker. A request of another worker
that waits for a sync round this one has not pushed to therefore waits for ever: it is found here
and fails, naming who is where. A worker's next request shows that its call completed for every
worker, since the scheduler answers them all at once (``back``).
"""

from __future__ import annotations

from collections.abc import Iterable

from trainer_core.ps import protocol
from trainer_core.ps.request import KeyState, Request


class Away:
    """rank -> (the collective call, how many such calls that worker made so far)."""

    def __init__(self) -> None:
        self.calls: dict[int, tuple[str, int]] = {}

    def __bool__(self) -> bool:
        return bool(self.calls)

    def enter(self, rank: int, at: str, count: int) -> None:
        self.calls[rank] = (at, count)

    def forget(self, ranks: set[int]) -> None:
        """The workers ``ranks`` left an elastic job: they are in no call any more."""
        for r in ranks:
            self.calls.pop(r, None)

    def back(self, rank: int) -> None:
        """Worker ``rank`` sent a request: its call completed for every worker, who all left that
        call or an earlier one (a worker already in its next call, whose notice came first, stays)."""
        mine = self.calls.get(rank)
        if mine is not None:
            self.calls = {r: a for r, a in self.calls.items() if a[1] > mine[1]}

    def stuck(
        self, states: Iterable[tuple[tuple[protocol.Key, int], KeyState]]
    ) -> dict[int, tuple[Request, str]]:
        """The requests of ``states`` that wait for a round missing the push of a worker in a
        collective call, by ``id``, each with the message saying so (a push waits for nothing, and
        a worker in a collective call itself does not wait for its requests)."""
        found: dict[int, tuple[Request, str]] = {}
        for kid, st in states:
            if not st.pushed:
                continue  # no open round: nothing waits
            away = [r for r in sorted(self.calls) if r not in st.pushed]
            if not away:
                continue
            for req, _ in st.waiting + st.deferred:
                if req.rank in self.calls or req.failed or req.header.op == protocol.PUSH:
                    continue
                if id(req) not in found:
                    found[id(req)] = (req, self.reason(req.rank, kid, away))
        return found

    def reason(self, rank: int, kid: tuple[protocol.Key, int], away: list[int]) -> str:
        where = "; ".join(f"worker {r} is in {self.calls[r][0]}" for r in away)
        pushers = ", ".join(f"worker {r}" for r in away)
        return (
            f"worker {rank} waits for key {kid[0]!r} (part {kid[1]}) to be pushed by {pushers} in this "
            f"sync round, which never happens: {where}. In sync mode every worker pushes the same keys "
            "between two collective calls (barrier, init, set_*)"
        )
