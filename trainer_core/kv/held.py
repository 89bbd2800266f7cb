"""A push whose pull may follow: sent as a ``pushpull`` at once, or held back briefly, so that the
pull right after it costs no message of its own.

MXNet code and Gluon's trainer write ``kv.push(k, g); kv.pull(k, out=w)``. Sent as they come,
that is two messages per server (two header encodes, two sends, two server wake-ups) where
``pushpull`` needs one. ``DistKVStore.push`` packs its data at once (the caller may reuse the
array when ``push`` returns: the values are in a segment, a compressed payload or a private
copy), then:

* **asked** (``Asked``): in a sync job, when every part lies in shared memory with its server,
  the push goes out at once as a ``pushpull``. Its replies are small (they point into the
  servers' buffers), and in a sync round the value a pull would get stays until this worker
  pushes the key again, so a ``pull`` of exactly its keys as the next call waits for those
  replies and sends nothing; any other call stops waiting for them (``WorkerClient.forget``:
  each is dropped when it comes, an error reply is raised by a later call). The server reads the
  push where it lies until the round's next push or this worker's next message
  (``Store.release``), so the segment is free whenever a later request is answered, as for a
  push. At most ``MAX_UNCLAIMED`` such replies are left unclaimed at once, so they never fill a
  socket's buffer; beyond that a push is held.
* **held** (``Held``, otherwise): the messages are kept here instead of being sent, and the next
  call on the store decides:

  - a ``pull`` of exactly the held push's keys sends the held messages as ``pushpull`` (same
    order, same server handling: the pull sees that push's round);
  - any other call first sends the held messages as plain pushes, then does its own work;
  - if no call comes within ``HOLD_S``, a helper thread sends them (a worker that pushes and then
    waits on something outside the store must not hold up the other workers' round). The helper
    is not woken per push: it looks every ``HOLD_S`` while pushes keep coming, and sleeps once
    none came since its last look (the next push wakes it).

Errors are never lost: a refused ``pushpull`` raises from the ``pull``, a refused push surfaces
at a later call (``WorkerClient.check``), and an exception while the helper thread sends is kept
and raised by the next call. A push whose frames would leave from the caller's own array (a
``caps.direct`` channel sends them before ``send`` returns, without a copy) is never held.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from trainer_core.errors import KVError
from trainer_core.kv.keys import Outgoing, Where
from trainer_core.ps.protocol import Key

#: the longest a push waits for the next call before the helper thread sends it (seconds)
HOLD_S = 0.001
#: the most replies of asked pushes left unclaimed (in flight or unread) before pushes are held
MAX_UNCLAIMED = 32


@dataclass
class Packed:
    """One push call's messages, packed."""

    per_server: dict[int, Outgoing]
    compressed: bool
    keys: frozenset[Key]

    def wheres(self) -> list[Where]:
        return [out.where for out in self.per_server.values()]


@dataclass
class Held(Packed):
    """A push call's messages, not sent."""

    since: float = field(default_factory=time.monotonic)


@dataclass
class Asked(Packed):
    """A push call's messages, sent as ``pushpull``s whose replies nobody waits for yet."""

    sent: dict[int, tuple[int, Where]]  # seq -> (server, parts)

    def servers(self) -> dict[int, int]:
        return {seq: server for seq, (server, _) in self.sent.items()}


def askable(
    uncompressed_sync: bool, per_server: Mapping[int, Any], same_host: list[bool], unclaimed: Collection[int]
) -> bool:
    """Whether a push goes out as a ``pushpull`` whose replies a pull may take (``Asked``): an
    uncompressed push of a sync job whose servers all share memory with this worker, few replies
    unclaimed."""
    return uncompressed_sync and len(unclaimed) < MAX_UNCLAIMED and all(same_host[s] for s in per_server)


class PushHold:
    """The held or asked push of one store, its lock (every call on the store runs under it) and
    the helper thread that sends a held push nobody took within ``HOLD_S``.

    While pushes keep coming the helper stays awake, looking every ``HOLD_S`` (a push waits at
    most that long past its ``HOLD_S``), so a push costs no thread wake-up; once it finds that no
    push was held since its last look it sleeps until ``hold`` wakes it."""

    def __init__(
        self, send: Callable[[Held], None], forget: Callable[[dict[int, int]], None], hold_s: float = HOLD_S
    ) -> None:
        self.lock = threading.RLock()
        self.held: Held | None = None
        self.asked: Asked | None = None
        self.error: BaseException | None = None
        self.hold_s = hold_s
        self._send = send
        self._forget = forget
        self._kick = threading.Event()
        self._holds = 0  # pushes held so far (the helper compares it between its looks)
        self._asleep = False  # the helper waits for ``_kick``
        self._closed = False
        self._thread: threading.Thread | None = None

    def hold(self, held: Held) -> None:
        """Keep ``held`` (under ``lock``; nothing may be held already)."""
        assert self.held is None and self.asked is None
        self.held = held
        self._holds += 1
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="trainer_core push", daemon=True)
            self._thread.start()
        elif self._asleep:
            self._kick.set()

    def ask(self, asked: Asked) -> None:
        """Keep ``asked`` (under ``lock``; nothing may be held or asked already)."""
        assert self.held is None and self.asked is None
        self.asked = asked

    def take(self, keys: frozenset[Key]) -> Held | Asked | None:
        """The held or asked push if it is of exactly ``keys`` (it is then no longer kept)."""
        asked = self.asked
        if asked is not None and asked.keys == keys:
            self.asked = None
            return asked
        held = self.held
        if held is None or held.keys != keys:
            return None
        self.held = None
        return held

    def check(self) -> None:
        """Raise what the helper thread met while sending (once)."""
        if self.error is not None:
            err, self.error = self.error, None
            raise err

    def flush(self) -> None:
        """Send the held push now, and stop waiting for the replies of an asked one (under ``lock``)."""
        asked, self.asked = self.asked, None
        if asked is not None:
            self._forget(asked.servers())
        held, self.held = self.held, None
        if held is not None:
            self._send(held)

    def drop(self) -> None:
        """Forget the held or asked push (the job is being aborted) and stop the helper thread."""
        self.held = self.asked = None
        self.close()

    def close(self) -> None:
        self._closed = True
        self._kick.set()

    def _run(self) -> None:
        seen = -1
        wait = self.hold_s
        while True:
            time.sleep(wait)
            if self._closed:
                return
            wait = self.hold_s
            due = self._send_due()
            if due > 0:  # a push is held that is not due yet: look again when it is
                wait = due
                continue
            if self._holds == seen:  # no push since the last look: sleep until the next one
                self._kick.clear()
                self._asleep = True
                if self._holds == seen and not self._closed:  # (``hold`` may have come meanwhile)
                    self._kick.wait()
                self._asleep = False
                if self._closed:
                    return
            seen = self._holds

    def _send_due(self) -> float:
        """Send the held push if it waited ``hold_s`` and no call is running; else the seconds until
        it is due (0: nothing held, or a running call sends or takes it)."""
        if not self.lock.acquire(blocking=False):
            return 0.0  # a call is running: it sends (or takes) what is held
        try:
            held = self.held
            if held is None:
                return 0.0
            left = held.since + self.hold_s - time.monotonic()
            if left > 0:
                return left
            self.held = None
            self._send(held)
        except BaseException as exc:  # raised by the next call
            self.error = exc
        finally:
            self.lock.release()
        return 0.0


F = TypeVar("F", bound=Callable[..., Any])


def closed_error(kind: str, failure: BaseException | None, call: str) -> KVError:
    """A call on a closed store: why it is closed (the job's failure, or ``close()``)."""
    if failure is not None:
        return KVError(f"kvstore {kind!r} is closed: the job failed ({failure}); no {call} after that")
    return KVError(f"kvstore {kind!r} is closed (close() was called): no {call} after close()")


def serial(flush: bool = True) -> Callable[[F], F]:
    """Run a store method under its ``hold.lock``, after raising what the helper thread met and
    (``flush``) sending a held push (or forgetting an asked one); ``_exchange`` flushes by itself,
    as a pull may take it."""

    def wrap(method: F) -> F:
        @functools.wraps(method)
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            with self.hold.lock:
                self.hold.check()
                if self._closed:
                    raise closed_error(self.type, self.client.failure, method.__name__)
                if flush:
                    self.hold.flush()
                return method(self, *args, **kwargs)

        return cast(F, call)

    return wrap
