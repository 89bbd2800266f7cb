"""The collective group of a job's workers, made from the environment through the node layer.

>>> group = join()            # every worker of the job calls it (DMLC_* from the launcher)
>>> total = group.allreduce(grad)
>>> group.close()             # every worker: finish the job, close the links

``join`` joins the job through its scheduler (``node.postoffice.Postoffice``, with the
collectives' message kinds), links this worker to every other (``netlinks.NetLinks``) and
returns a ``JobGroup``: rank = the worker's rank, size = the number of workers, the hosts of
every rank (their machine identities, for the hierarchical path), and ``local_rank`` and
``local_size`` among the workers of this machine, all from the book.

In an elastic job (``LAUNCHKIT_ELASTIC``) the group is that of one epoch: when a worker leaves
or joins, every survivor's operation fails with ``MembershipChanged`` and ``reform(group)``
returns the group of the new epoch (dense ranks, the same-host segment made again); a worker
that joins later meets the survivors there. The worker tells the launcher that it handles the
changes in its own process (``dmlc_env.ELASTIC_IN_PROCESS_FIGURE``).

>>> try:
...     total = group.allreduce(grad)
... except MembershipChanged:
...     group = reform(group)     # every survivor (and any newcomer, in its join)
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import dmlc_env
import trainer_core.metrics as metrics
from trainer_core.config import NodeConfig, StallPolicy
from trainer_core.errors import NodeFailure
from trainer_core.log import get_logger
from trainer_core.node import protocol as node_protocol
from trainer_core.node.postoffice import Postoffice

from . import nccl
from .group import Group
from .policy import Thresholds
from .primitives.links import DEFAULT_TIMEOUT
from .sockets import protocol
from .sockets.netlinks import NetLinks
from .timeline import Timeline

#: what a worker of a collective job decodes: the node layer's kinds and the collectives'
SCHEMA = node_protocol.SCHEMA | protocol.SCHEMA


class JobGroup(Group):
    """The group of every worker of the job; owns its node and links (``close`` ends both)."""

    def __init__(
        self,
        node: Postoffice,
        links: NetLinks,
        thresholds: Thresholds | None = None,
        use_nccl: bool = True,
        owns_node: bool = True,
    ) -> None:
        workers = links.book.workers
        self.use_nccl = use_nccl
        #: ``close`` finishes the job and stops the node; False: the node is shared with another
        #: customer (the parameter server's client, ``join(node=...)``), whose owner finishes it
        self.owns_node = owns_node
        super().__init__(links, [w.host_key for w in workers], thresholds)
        self.node = node
        self.netlinks = links
        #: the host name of every rank, in rank order
        self.hosts = tuple(w.host_key.split("|")[0] for w in workers)
        assert self.topology is not None
        local = self.topology.local(links.rank)
        self.local_rank = local.index(links.rank)
        self.local_size = len(local)
        # every rank asks at once (a collective): NCCL for device arrays when all can use it
        self.nccl = nccl.agree(self, nccl.load() if use_nccl else None, log=node.log)

    def starting(self) -> None:
        """An elastic job's membership changed since this group's epoch: ``MembershipChanged``
        (a worker that joined waits for the survivors in ``reform``)."""
        self.netlinks.changed()

    def start_timeline(self, path: str, mark_cycles: bool = False) -> None:
        """Write each operation's phases to ``path`` from now on (``timeline``; Horovod's
        ``start_timeline``); a timeline already running is closed first."""
        self.stop_timeline()
        self.record(Timeline(path, self.rank, mark_cycles))

    def stop_timeline(self) -> None:
        tl = self.record(None)
        if isinstance(tl, Timeline):
            tl.close()

    @property
    def epoch(self) -> int:
        """The membership's epoch this group was formed in (0 but in an elastic job)."""
        return self.netlinks.book.epoch

    def close(self, finish: bool = True, leave: bool = True, sets: Mapping[int, int] | None = None) -> None:
        """Finish the queued operations; then, leaving the job (``leave``), say bye to the peers (a
        peer that waits for this rank in a later operation fails at once, naming it:
        ``PeerShutDown``) and (``finish``, and the job has not failed) wait for every worker to
        finish as well, and leave the job. ``leave=False`` (``reform``): the links close, the node
        stays. ``sets``: the operations this rank took part in, by process set
        (``subgroups.Subgroups.close``): a peer that waits for it in a later one of a set fails at
        once as well. Once this rank has said bye, the job failing while it waits in the finish
        (a peer died, the scheduler's abort) is the others' to report: it is logged and ``close``
        returns, so that the rank that shut down ends with 0 and the launcher names it as the one
        the others waited for (docs/collectives.md, "A rank that shut down")."""
        try:
            super().close()
            self.stop_timeline()
            if leave:
                self.netlinks.leave(self._negotiator.slots, sets)
            if finish and leave and self.owns_node and self.node.failure is None:
                # (a peer's death ends the wait too; an elastic job's membership changes are not ends)
                check = None if self.netlinks.elastic else self.netlinks.health
                try:
                    self.node.finish(check)
                except NodeFailure as exc:
                    self.node.log.warning(
                        "collective: this rank closed its group; the job failed while it waited for "
                        "the other workers to finish: %s",
                        exc,
                    )
        finally:
            self.netlinks.close()
            if leave and self.owns_node:
                self.node.stop()
                self.node.close_transport()


#: the scheduler barrier where an elastic job's members meet before they form a group
REGROUP = "collective.reform()"


def meet(node: Postoffice) -> None:
    """Wait until every member of the current epoch is here (a barrier at the scheduler), then
    until this node has the book of the epoch the barrier completed in (the two come on two
    channels). Every member's links of an earlier epoch are closed by then: a connection made
    after it reaches a group of the new epoch."""
    reply = node.scheduler_call(node_protocol.BARRIER, node_protocol.BARRIER_DONE, body={"at": REGROUP})
    epoch = reply.get("epoch")
    if isinstance(epoch, int) and node.book.epoch < epoch:
        node.wait_book(epoch - 1, node.grace_s)


def reform(group: JobGroup, log: logging.Logger | None = None) -> JobGroup:
    """The group of the current epoch, after an operation of ``group`` failed with
    ``MembershipChanged`` (an elastic job): ``group``'s links are closed (not its node), every
    member meets at the scheduler, and the links of the new epoch are made. Every survivor calls
    it; a worker that joined later meets them in its ``join``. ``MembershipChanged`` again when
    the membership changes once more meanwhile: call it again."""
    node, old = group.node, group.netlinks
    group.close(finish=False, leave=False)
    return _form(
        node,
        old.cfg,
        old.timeout,
        log or old.log,
        old.stall,
        group.thresholds,
        group.use_nccl,
        group.owns_node,
    )


def _form(
    node: Postoffice,
    cfg: NodeConfig,
    timeout: float,
    log: logging.Logger,
    stall: StallPolicy,
    thresholds: Thresholds | None,
    use_nccl: bool,
    owns_node: bool = True,
) -> JobGroup:
    """The group of the node's current epoch (an elastic job's members meet first)."""
    if cfg.env.elastic is not None:
        meet(node)
    links = NetLinks(node, cfg, timeout, log, stall)
    try:
        return JobGroup(node, links, thresholds, use_nccl, owns_node)
    except BaseException:  # its first collective (nccl.agree) failed: a peer is gone
        links.close()
        raise


def join(
    environ: Mapping[str, str] | None = None,
    log: logging.Logger | None = None,
    thresholds: Thresholds | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    exit_on_failure: bool = True,
    use_nccl: bool = True,
    stall_check_s: float | None = None,
    stall_shutdown_s: float | None = None,
    node: Postoffice | None = None,
) -> JobGroup:
    """Join the job of ``environ`` (default: this process's) as a worker and return its group;
    ``timeout``: seconds one point-to-point wait lasts at most in a job without heartbeats (with
    them, a live peer is waited for and a dead one ends the job); ``stall_check_s``: a wait for a
    live peer warns after this long, and again every as long (default
    ``TRAINER_CORE_STALL_CHECK_SECONDS``, else 60; 0: never); ``stall_shutdown_s``: and gives up
    after this long (default ``TRAINER_CORE_STALL_SHUTDOWN_SECONDS``, else 0: never); ``exit_on_failure``: a failure of
    the job that the caller's code does not meet in a collective soon (a long computation) ends
    the process, as the parameter server's workers do (``Postoffice.exit_on_failure``);
    ``use_nccl``: cupy arrays go through NCCL when every worker can use it (``nccl.agree``).
    ``node``: this worker's node, joined already by another customer of it in this process (the
    parameter server's client in a job with servers: one registration for both, with
    ``SCHEMA`` among its transport's kinds); the group's ``close`` then leaves the other workers'
    links only, and the node's owner finishes the job (``exit_on_failure`` is the owner's too)."""
    cfg = NodeConfig.from_environ(environ)
    stall = cfg.stall.replace(stall_check_s, stall_shutdown_s)
    log = log or get_logger(cfg.verbose)
    if node is not None:
        return _form(node, cfg, timeout, log, stall, thresholds, use_nccl, owns_node=False)
    node = Postoffice.join(cfg, log, SCHEMA)
    try:
        group = _form(node, cfg, timeout, log, stall, thresholds, use_nccl)
    except BaseException:
        node.stop()
        node.close_transport()
        raise
    if exit_on_failure:
        node.exit_on_failure()
    if cfg.env.elastic is not None:  # for the launcher: the survivors of a change run on
        metrics.report(**{dmlc_env.ELASTIC_IN_PROCESS_FIGURE: 1})
    return group
