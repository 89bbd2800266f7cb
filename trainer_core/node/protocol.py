"""The node layer's messages (docs/wire.md): between every node and the scheduler.

Registration and the book, heartbeats, barriers and agreements (``agree``: a job-wide setting
every worker gives), the end of a job (finish, terminate) and aborts.
They carry no entries; each protocol above (``ps.protocol``) adds its own kinds to ``SCHEMA``.
"""

from __future__ import annotations

from trainer_core.transport.wire import Schema

REGISTER, BOOK, HEARTBEAT, HEARTBEAT_ACK = "register", "book", "hb", "hb_ack"
BARRIER, BARRIER_DONE, FINISH, FINISHED = "barrier", "barrier_done", "finish", "finished"
ABORT, TERMINATE = "abort", "terminate"
#: a worker's job-wide setting, agreed by every worker (``node/agree.py``), and the answer
AGREE, AGREED = "agree", "agreed"
ERROR = "error"  # the scheduler refusing a registration

OPS = frozenset(
    {
        REGISTER,
        BOOK,
        HEARTBEAT,
        HEARTBEAT_ACK,
        BARRIER,
        BARRIER_DONE,
        FINISH,
        FINISHED,
        ABORT,
        TERMINATE,
        AGREE,
        AGREED,
        ERROR,
    }
)
SCHEMA = Schema(OPS)
