"""Distributed training of a small MLP on scikit-learn's bundled digits data set.

    launchkit launch -n 4 -s 2 --launcher local python examples/train_digits.py
    launchkit launch -n 4 -s 2 --launcher local python examples/train_digits.py --compression 1bit
    launchkit launch -n 4 -s 2 --launcher local python examples/train_digits.py --learner block_momentum
    launchkit launch -n 4 -s 2 --launcher local python examples/train_digits.py --learner async
    launchkit launch -n 4 -s 0 --launcher local python examples/train_digits.py --comm allreduce
    launchkit launch -n 2:4 -s 0 --launcher local python examples/train_digits.py --elastic

Every role runs this same script: with ``DMLC_ROLE=scheduler`` or ``server`` the
``import trainer_core`` below runs that role and exits when the job ends (as MXNet does).
Workers each train on their own shard (``SplitSampler``) through a distributed learner
(``trainer_core.train.learners``):

* ``data_parallel`` (default): every step the workers' gradients are summed by the servers
  (``pushpull``) and every worker applies the same averaged update; ``--compression 1bit|2bit|topk``
  sends them compressed (the KV store's ``set_gradient_compression``);
* ``block_momentum``: local steps, the models are merged every ``--block-size`` samples (BMUF,
  Nesterov block momentum); warm-started: the first epoch is trained locally (``--distributed-after``);
* ``model_averaging``: local steps, the models are averaged every ``--sync-period`` samples per worker;
* ``async``: asynchronous SGD, the servers apply each worker's gradients at once (``dist_async``;
  every push is an update, so the default learning rate is divided by the number of workers).

``--comm allreduce`` (a job without servers, ``-s 0``) sums on the workers instead: allreduce
among them (``trainer_core.collective.group()`` and the learners' ``CollectiveCommunicator``;
``--compression 1bit|2bit`` through the compressed allreduce with error feedback); every learner
but ``async`` (whose rule runs on the servers).

Rank 0 prints the loss and the test accuracy after every epoch, and at the end the bytes one
worker put on the wire per step. ``--checkpoint PATH`` (a ``.npz``) is written by rank 0 after
every epoch, each other worker's own state beside it (``PATH.workerN.npz``: its compression
residuals; with ``--comm allreduce`` also its local learner's state); with ``--resume`` a run
continues from the epoch after it, every worker with its own residuals (the parameter servers'
state too with ``--comm ps``). ``launchkit launch --max-restarts N ... --resume`` thus resumes a
job that failed from its last checkpoint (docs/reliability.md).

``--elastic`` (an ``-n MIN:MAX`` job without servers; it implies ``--comm allreduce``) trains on
when workers leave or join (docs/elastic.md): the loop runs under ``trainer_core.train.elastic.run``
with a ``LearnerState`` committed after every step (the parameters, the learners' state, the epoch
and how far it got). At a change every survivor goes back to the last commit, joins the group of
the new epoch, builds its communicator and learner on it again and takes rank 0's state; a worker
that joins later does the same in its own ``join``. Each epoch's order of the training set is
taken in lockstep steps from a position (``train.data.lockstep_batch``) rather than split into
fixed parts, so the epoch goes on at the new size: no sample skipped or trained twice. Rank 0's
epoch line says how many workers finished the epoch.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np

import trainer_core  # noqa: F401  (runs the scheduler / server roles)
from trainer_core import collective, metrics
from trainer_core import kv as kvstore
from trainer_core.optim.local import get_learner
from trainer_core.train import checkpoint
from trainer_core.train.collcomm import CollectiveCommunicator
from trainer_core.train.comm import Communicator, KVCommunicator
from trainer_core.train.data import SplitSampler, lockstep_batch
from trainer_core.train.elastic import LearnerState, run
from trainer_core.train.learners import (
    DistributedLearner,
    async_sgd_distributed_learner,
    block_momentum_distributed_learner,
    data_parallel_distributed_learner,
    model_averaging_distributed_learner,
)
from trainer_core.train.nn import MLP

COMPRESSION = {
    "none": None,
    "1bit": {"type": "1bit"},
    "2bit": {"type": "2bit"},  # the threshold comes from --threshold
    "topk": {"type": "topk"},
}
LEARNERS = ("data_parallel", "block_momentum", "model_averaging", "async")


def load_digits(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's digits split 3:1, stratified (its ``train_test_split``), pixels scaled to [0, 1]."""
    from digits import load  # beside this script: the same split without importing scikit-learn

    x_train, y_train, x_test, y_test = load(seed)
    return (x_train / 16.0).astype(np.float32), y_train, (x_test / 16.0).astype(np.float32), y_test


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=None, help="default 0.03; 0.03 / workers for async")
    p.add_argument("--optimizer", default="momentum", choices=["sgd", "momentum", "nesterov", "adam"])
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--learner", default="data_parallel", choices=LEARNERS)
    p.add_argument("--compression", default="none", choices=sorted(COMPRESSION))
    p.add_argument(
        "--threshold",
        type=float,
        default=0.05,
        help="2bit threshold, on the gradients' scale (periodic learners: times lr and local steps per sync)",
    )
    p.add_argument("--topk-ratio", type=float, default=0.01, help="fraction of values topk sends")
    p.add_argument(
        "--block-size",
        type=int,
        default=0,
        help="block_momentum: samples per block over all workers (default: 2 minibatches per worker)",
    )
    p.add_argument(
        "--sync-period",
        type=int,
        default=0,
        help="model_averaging: samples per worker between averages (default: 4 minibatches)",
    )
    p.add_argument(
        "--distributed-after",
        type=int,
        default=None,
        help="samples per worker trained locally first (default: one epoch for block_momentum, else 0)",
    )
    p.add_argument("--checkpoint", default=None, help="a .npz file rank 0 writes after every epoch")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint when it exists")
    p.add_argument("--kvstore", default=None, help="dist_sync (dist_async for --learner async), or local")
    p.add_argument(
        "--comm",
        default=None,
        choices=["ps", "allreduce"],
        help="sum through the parameter servers (the default), or allreduce among the workers (-s 0)",
    )
    p.add_argument(
        "--elastic",
        action="store_true",
        help="train on when workers leave or join (launchkit launch -n MIN:MAX -s 0; --comm allreduce)",
    )
    args = p.parse_args()
    if args.elastic:
        if args.comm == "ps" or args.learner == "async" or args.kvstore:
            p.error(
                "--elastic trains on the workers' collective group: "
                "not with --comm ps, --learner async or --kvstore"
            )
        if args.checkpoint:
            p.error("--elastic keeps its state in memory (trainer_core.train.elastic): not with --checkpoint")
    args.comm = args.comm or ("allreduce" if args.elastic else "ps")
    if args.resume and not args.checkpoint:  # it trained from scratch, saying nothing
        p.error("--resume continues from --checkpoint PATH: give it too")
    return args


def local_steps_per_sync(args: argparse.Namespace, workers: int) -> int:
    """Local steps between two exchanges (1 for data parallel)."""
    if args.learner == "block_momentum":
        return max(1, (args.block_size or 2 * args.batch_size * workers) // workers // args.batch_size)
    if args.learner == "model_averaging":
        return max(1, (args.sync_period or 4 * args.batch_size) // args.batch_size)
    return 1


def compression_params(args: argparse.Namespace, workers: int) -> dict[str, Any] | None:
    params = COMPRESSION[args.compression]
    if params is None:
        return None
    if args.compression == "2bit":
        # periodic learners push model deltas, about lr * local steps times a gradient
        scale = 1.0 if args.learner == "data_parallel" else args.lr_used * local_steps_per_sync(args, workers)
        return {**params, "threshold": args.threshold * scale}
    if args.compression == "topk":
        return {**params, "ratio": args.topk_ratio}
    return dict(params)


def connect(args: argparse.Namespace) -> tuple[Any, Communicator]:
    """The KV store (``None`` with ``--comm allreduce``) and the learners' communicator."""
    if args.comm == "allreduce":
        if args.learner == "async":
            raise SystemExit("--learner async runs its rule on the parameter servers: use --comm ps")
        return None, CollectiveCommunicator(collective.group())
    kv = kvstore.create(args.kvstore or ("dist_async" if args.learner == "async" else "dist_sync"))
    return kv, KVCommunicator(kv)


def make_learner(args: argparse.Namespace, kv: Any, comm: Communicator, model: MLP) -> DistributedLearner:
    kw = {"momentum": 0.9} if args.optimizer in ("momentum", "nesterov") else {}
    local = get_learner(args.optimizer, model.params, lr=args.lr_used, **kw)
    workers = comm.num_workers()
    comp = compression_params(args, workers)
    if args.learner == "data_parallel":
        return data_parallel_distributed_learner(
            local, args.distributed_after, communicator=comm, compression=comp
        )
    if args.learner == "block_momentum":
        block = args.block_size or 2 * args.batch_size * workers
        return block_momentum_distributed_learner(
            local, block, distributed_after=args.distributed_after, communicator=comm, compression=comp
        )
    if args.learner == "model_averaging":
        period = args.sync_period or 4 * args.batch_size
        return model_averaging_distributed_learner(
            local, period, args.distributed_after, communicator=comm, compression=comp
        )
    if comp is not None:
        raise SystemExit(
            "--learner async sends 32-bit gradients (its pulls are parameters): use --compression none"
        )
    return async_sgd_distributed_learner(local, args.distributed_after, kv=kv)


def wire_counters(kv: Any) -> dict[str, int] | None:
    """The KV store's byte counters (``wire_stats``), when it keeps them."""
    stats = getattr(kv, "wire_stats", None) if kv is not None else None
    return dict(stats()) if callable(stats) else None


def wire_bytes_per_step(
    kv: Any, learner: DistributedLearner, steps: int, before: dict[str, int] | None
) -> tuple[float, str]:
    """Bytes this worker put on the wire per training step (pushed plus pulled payloads): measured
    by the KV store since ``before`` when it counts them, else the compressors' payload sizes (an
    allreduce's ring sends and receives ``2 (N-1)/N`` of them)."""
    now = wire_counters(kv)
    if now is not None and before is not None:
        moved = now["sent"] + now["received"] - before["sent"] - before["received"]
        return moved / max(1, steps), "measured"
    n = learner.num_workers
    share, how = (2 * (n - 1) / n, "allreduce payload") if kv is None else (1.0, "payload")
    return share * learner.syncs * learner.payload_bytes_per_sync() / max(1, steps), how


def allreduce_residuals(comm: Communicator) -> dict[str, dict[str, Any]]:
    """This worker's compressed allreduce residuals (``CollectiveCommunicator.compression_state``)."""
    state = getattr(comm, "compression_state", None)
    return dict(state()) if callable(state) else {}


def resume(
    args: argparse.Namespace, kv: Any, comm: Communicator, learner: DistributedLearner, ck: Any
) -> None:
    """Restore the learner from rank 0's checkpoint ``ck``, then this worker's own state: rank 0's
    residuals are in ``ck``, every other worker's residuals (and, without servers, its local
    learner state) in its file of the same step; with servers also theirs (collective)."""
    checkpoint.restore_learner(learner, ck)
    if kv is not None:
        checkpoint.restore_server(kv, ck)  # collective: every worker, after the learner's init
        load_residuals = getattr(kv, "load_compression_state", None)
        if ck.compression is not None and callable(load_residuals):
            rank = int(kv.rank)
            load_residuals(
                ck.residuals if rank == 0 else checkpoint.load_worker(args.checkpoint, rank, step=ck.step)
            )
        return
    mine = ck
    if not comm.is_main():
        mine = checkpoint.load_worker_state(args.checkpoint, comm.rank(), step=ck.step)
        checkpoint.restore_local_learner(learner, mine)
    load = getattr(comm, "load_compression_state", None)
    if ck.compression is not None and callable(load):
        load(mine.residuals)


def save_checkpoint(
    args: argparse.Namespace,
    kv: Any,
    comm: Communicator,
    model: MLP,
    learner: DistributedLearner,
    epoch: int,
    step: int,
) -> None:
    """Every worker takes part (fetching the servers' state is collective). Every other worker
    first writes its own push residuals next to the checkpoint; then (past the barrier that
    fetching the servers' state begins with) rank 0 writes the parameters, learner state, servers'
    state (optimizer slots, pull residuals) and its own push residuals. A job killed in between
    resumes from rank 0's previous checkpoint, whose step the worker files still hold. Without a
    KV store (``--comm allreduce``) the same order with barriers: every other worker writes its
    compressed allreduce residuals and its local learner's state, then rank 0 the parameters, the
    learner's state and its own residuals."""
    comp = compression_params(args, comm.num_workers())
    if kv is None:
        residuals = allreduce_residuals(comm) if comp is not None else {}
        if not comm.is_main():
            checkpoint.save_worker(args.checkpoint, comm.rank(), residuals, step=step, learner=learner)
        comm.barrier()  # every worker file is of this step before rank 0's checkpoint is
        if comm.is_main():
            checkpoint.save(
                args.checkpoint,
                params=model.params,
                learner=learner,
                residuals=residuals,
                step=step,
                epoch=epoch,
                compression=comp,
                extra={"learner": args.learner, "comm": args.comm},
            )
        comm.barrier()  # rank 0's is written before any worker file moves on to the next step
        return
    state = getattr(kv, "compression_state", None)
    residuals = state() if comp is not None and callable(state) else None
    if kv.rank != 0 and residuals:
        checkpoint.save_worker(args.checkpoint, kv.rank, residuals, step=step)
    server = kv.server_state()
    if kv.rank == 0:
        checkpoint.save(
            args.checkpoint,
            params=model.params,
            learner=learner,
            residuals=residuals,
            step=step,
            epoch=epoch,
            compression=comp,
            extra={"learner": args.learner},
            server_state=server,
        )


def train_elastic(args: argparse.Namespace) -> None:
    """``--elastic``: the epochs under ``elastic.run``; a change of the workers goes back to the
    last commit (after every step), and the communicator and the learner are built again on the
    group of the new epoch (see the module's text)."""
    x_train, y_train, x_test, y_test = load_digits(args.seed)
    model = MLP([x_train.shape[1], args.hidden, 10], seed=args.seed)
    order = SplitSampler(len(x_train), 1, 0, seed=args.seed).order  # the epoch's order, every worker's
    args.lr_used = args.lr if args.lr is not None else 0.03
    warm_start = args.distributed_after
    state = LearnerState(epoch=0, processed=0, step=0, loss_sum=0.0, loss_steps=0)

    def train(group: Any) -> Communicator:
        comm = CollectiveCommunicator(group)
        size, rank, batch = comm.num_workers(), comm.rank(), args.batch_size
        if warm_start is None:  # block momentum: one epoch's samples per worker at this size, locally
            steps = len(x_train) // size // batch
            args.distributed_after = steps * batch if args.learner == "block_momentum" else 0
        learner = make_learner(args, None, comm, model)
        state.sync(comm, learner)  # rank 0's last commit (a new state: read it again)
        v = state.values
        while v["epoch"] < args.epochs:
            t0, epoch_order = time.monotonic(), order(v["epoch"])
            while (idx := lockstep_batch(epoch_order, v["processed"], rank, size, batch)) is not None:
                loss, grads = model.loss_and_grads(x_train[idx], y_train[idx])
                learner.update(grads, len(idx))
                v["processed"] += size * batch
                v.update(step=v["step"] + 1, loss_sum=v["loss_sum"] + loss, loss_steps=v["loss_steps"] + 1)
                state.commit(learner)
                metrics.report(step=v["step"], loss=loss, samples=len(idx))
            learner.flush()
            mean_loss = v["loss_sum"] / max(1, v["loss_steps"])
            v.update(epoch=v["epoch"] + 1, processed=0, loss_sum=0.0, loss_steps=0)
            state.commit(learner)
            if rank == 0:
                acc = model.accuracy(x_test, y_test)
                metrics.report(epoch=v["epoch"], accuracy=acc)
                print(
                    f"epoch {v['epoch']:3d}  loss {mean_loss:.4f}  test accuracy {acc * 100:.2f}%  "
                    f"({time.monotonic() - t0:.2f}s, {size} workers)",
                    flush=True,
                )
        comm.barrier()
        return comm

    comm = run(train, collective.join())
    comm.finalize()  # closes the group: every worker leaves the job


def main() -> None:
    args = parse_args()
    if args.elastic:
        train_elastic(args)
        return
    kv, comm = connect(args)
    rank, workers = comm.rank(), comm.num_workers()
    args.lr_used = args.lr if args.lr is not None else 0.03 / (workers if args.learner == "async" else 1)
    x_train, y_train, x_test, y_test = load_digits(args.seed)
    steps = (len(x_train) // workers) // args.batch_size  # the same on every worker (sync rounds)
    if args.distributed_after is None:
        # BMUF is warm-started (CNTK's advice for it and for 1-bit SGD): one epoch of local
        # training, then the models are averaged once and the blocks start (docs/learners.md)
        args.distributed_after = steps * args.batch_size if args.learner == "block_momentum" else 0
    model = MLP([x_train.shape[1], args.hidden, 10], seed=args.seed)
    ck = None
    if args.resume and args.checkpoint and os.path.exists(args.checkpoint):
        ck = checkpoint.load(args.checkpoint)
        checkpoint.restore_params(model.params, ck)
    learner = make_learner(args, kv, comm, model)
    if ck is not None:
        try:
            resume(args, kv, comm, learner, ck)
        except ValueError as e:  # a worker file missing or of another checkpoint, another shape
            print(f"train_digits.py: error: cannot resume from {args.checkpoint}: {e}", file=sys.stderr)
            raise SystemExit(2) from None
    start_epoch = ck.epoch if ck is not None else 0

    sampler = SplitSampler(len(x_train), workers, rank, seed=args.seed)
    main_rank = learner.communicator().is_main()
    if main_rank:
        resumed = f", resumed at epoch {start_epoch}" if ck is not None else ""
        print(
            f"{workers} workers, {steps} steps of {args.batch_size} per worker per epoch, "
            f"{model.num_parameters()} parameters, {args.learner}, compression {args.compression}{resumed}",
            flush=True,
        )
    dist_steps = 0  # steps trained distributed (the warm start's local steps move no bytes)
    before = wire_counters(kv)  # training traffic only: not the setup's exchanges
    unreported = 0  # samples trained since the last metrics report
    for epoch in range(start_epoch, args.epochs):
        t0 = time.monotonic()
        idx = sampler.indices(epoch)
        losses = []
        for step in range(steps):
            batch = idx[step * args.batch_size : (step + 1) * args.batch_size]
            loss, grads = model.loss_and_grads(x_train[batch], y_train[batch])
            losses.append(loss)
            unreported += len(batch)
            if step % 10 == 9 or step == steps - 1:  # the dashboard's figures (no-op without launchkit)
                metrics.report(step=epoch * steps + step + 1, loss=loss, samples=unreported)
                unreported = 0
            if learner.start_if_due():  # the warm start ends: one 32-bit model average, not counted
                before = wire_counters(kv)
            learner.update(grads, len(batch))
            dist_steps += learner.distributed
        learner.flush()
        if args.checkpoint:
            save_checkpoint(args, kv, comm, model, learner, epoch + 1, (epoch + 1) * steps)
        if main_rank:
            acc = model.accuracy(x_test, y_test)
            metrics.report(epoch=epoch + 1, accuracy=acc)
            print(
                f"epoch {epoch + 1:3d}  loss {np.mean(losses):.4f}  test accuracy {acc * 100:.2f}%  "
                f"({time.monotonic() - t0:.2f}s)",
                flush=True,
            )
    if main_rank:
        per_step, how = wire_bytes_per_step(kv, learner, dist_steps, before)
        raw = 2 * 4 * model.num_parameters()
        print(
            f"wire: {per_step:.0f} bytes per step per worker ({how}; 32-bit push+pull {raw}, "
            f"{raw / max(per_step, 1e-9):.1f}x less)",
            flush=True,
        )
    comm.barrier()
    comm.finalize()  # closes the KV store, or the group (every worker leaves the job)


if __name__ == "__main__":
    main()
