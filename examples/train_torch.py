"""A torch model trained with trainer_core.torch (Horovod's API): a small convolutional network on
scikit-learn's bundled digits (8x8 images, no download).

    python examples/train_torch.py                                          # one process
    launchkit launch -n 2 -s 0 --launcher local python examples/train_torch.py                 # allreduce
    launchkit launch -n 2 -s 0 --launcher local python examples/train_torch.py --compression 1bit
    launchkit launch -n 2 -s 1 --launcher local python examples/train_torch.py                 # parameter server
    launchkit launch -n 2 -s 1 --launcher local python examples/train_torch.py --server-optimizer
    launchkit launch -n 2:4 -s 0 --launcher local python examples/train_torch.py --elastic   # elastic

The script is a Horovod script with its import changed (``import trainer_core.torch as hvd``):
``init()``, the learning rate scaled by ``size()``, ``DistributedOptimizer``, then
``broadcast_parameters``/``broadcast_optimizer_state`` from rank 0. Every worker trains on its own
shard of the training set; rank 0 prints the mean loss, the test accuracy and samples/s per epoch.
With servers (``-s 1`` or more) gradients go through the parameter servers (``comm="ps"``);
``--server-optimizer`` makes the servers apply SGD (MXNet's ``update_on_kvstore``). Every process of
the job runs this script: a scheduler or server serves its role on ``import trainer_core``.
``--elastic`` trains with ``hvd.elastic`` (docs/elastic.md): an ``ElasticSampler`` over the whole
training set, a ``TorchState`` committed after every step, the learning rate rescaled at each change
of the workers; a worker that leaves or joins an ``-n MIN:MAX`` job does not stop the others.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

# first: a scheduler or server serves its role on this import and ends there, never importing
# torch (a second of CPU per process)
import trainer_core  # noqa: F401

# isort: split
import numpy as np
import torch

import trainer_core.torch as hvd
from trainer_core.torch import checkpoint

COMPRESSION = ("none", "fp16", "1bit", "2bit", "topk", "powersgd")


def compression(name: str, threshold: float) -> object:
    """The ``--compression`` choice (``--threshold``: 2-bit's, see docs/pytorch.md)."""
    return {
        "none": hvd.Compression.none,
        "fp16": hvd.Compression.fp16,
        "1bit": hvd.Compression.onebit,
        "2bit": hvd.Compression.twobit(threshold=threshold),
        "topk": hvd.Compression.topk(ratio=0.05),
        "powersgd": hvd.Compression.powersgd(rank=2),
    }[name]


def load_digits(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """scikit-learn's digits split 3:1, stratified (its ``train_test_split``), as 1x8x8 images."""
    from digits import load  # beside this script: the same split without importing scikit-learn

    x_tr, y_tr, x_te, y_te = load(seed)

    def images(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy((x / 16.0).astype(np.float32).reshape(-1, 1, 8, 8))

    return images(x_tr), torch.from_numpy(y_tr), images(x_te), torch.from_numpy(y_te)


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),  # 16 x 4 x 4
        torch.nn.Conv2d(16, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),  # 32 x 2 x 2
        torch.nn.Flatten(),
        torch.nn.Linear(128, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument(
        "--epochs", type=int, default=30, help="30: converged with 1 and 2 workers (docs/pytorch.md)"
    )
    p.add_argument("--batch-size", type=int, default=16, help="per worker")
    p.add_argument("--lr", type=float, default=0.1, help="per worker: scaled by the number of workers")
    p.add_argument(
        "--momentum", type=float, default=0.0, help="0.9 with compression diverges here (docs/pytorch.md)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compression", default="none", choices=COMPRESSION)
    p.add_argument(
        "--threshold", type=float, default=0.05, help="2bit's: values beyond it are sent as +-threshold"
    )
    p.add_argument(
        "--checkpoint",
        default=None,
        help="saved after every epoch (trainer_core.torch.checkpoint); its directory is made if missing",
    )
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint when it exists")
    p.add_argument("--server-optimizer", action="store_true", help="the servers apply SGD (-s 1 or more)")
    p.add_argument(
        "--elastic",
        action="store_true",
        help="hvd.elastic: train on when workers leave or join (launchkit launch -n MIN:MAX)",
    )
    args = p.parse_args()
    if args.elastic and (args.checkpoint or args.server_optimizer):
        p.error(
            "--elastic keeps its state in memory (hvd.elastic.TorchState): not with --checkpoint or --server-optimizer"
        )
    if args.resume and not args.checkpoint:  # it trained from scratch, saying nothing
        p.error("--resume continues from --checkpoint PATH: give it too")
    if args.checkpoint:
        where = Path(args.checkpoint).resolve().parent
        try:  # before training: an epoch's work is not lost on a place no checkpoint can be written to
            where.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=where):
                pass
        except OSError as e:
            p.error(f"--checkpoint {args.checkpoint}: cannot write in {where}: {e.strerror or e}")
    return args


def resume(
    args: argparse.Namespace, model: torch.nn.Module, opt: torch.optim.Optimizer, gen: torch.Generator
) -> int:
    """The epoch to start from: the checkpoint's (model, optimizer, residuals and this rank's data
    order restored), or 0 without one."""
    try:
        got = checkpoint.load(args.checkpoint, model, opt)
    except ValueError as e:
        print(f"train_torch.py: error: cannot resume from {args.checkpoint}: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if got is None:
        return 0
    epoch, extra = got
    gen.set_state(extra["generator"])
    if hvd.rank() == 0:
        print(f"resumed at epoch {epoch}", flush=True)
    return epoch


def train_elastic(
    args: argparse.Namespace,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    data: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
) -> None:
    """``--elastic``: Horovod's elastic loop. A change of the workers goes back to the last commit
    (after every step), re-forms the group and goes on; ``set_epoch`` at the end of an epoch."""
    x_tr, y_tr, x_te, y_te = data
    sampler = hvd.elastic.ElasticSampler(range(len(x_tr)), shuffle=True, seed=args.seed)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0, batch=0)

    def rescale() -> None:  # the learning rate follows the number of workers
        for group in opt.param_groups:
            group["lr"] = args.lr * hvd.size()

    state.register_reset_callbacks([rescale])

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.epoch < args.epochs:
            start, total, steps = time.perf_counter(), 0.0, 0
            model.train()
            while state.batch * args.batch_size < len(sampler):
                idx = torch.tensor(sampler.get_indices(state.batch, args.batch_size), dtype=torch.long)
                loss = torch.nn.functional.cross_entropy(model(x_tr[idx]), y_tr[idx])
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                total, steps = total + float(loss.detach()), steps + 1
                sampler.record_batch(state.batch, args.batch_size)
                state.batch += 1
                state.commit()
            model.eval()
            with torch.no_grad():
                acc = float((model(x_te).argmax(1) == y_te).float().mean()) * 100
            mean_loss = float(hvd.allreduce(torch.tensor([total / max(1, steps)])))
            if hvd.rank() == 0:
                rate = steps * args.batch_size * hvd.size() / (time.perf_counter() - start)
                print(
                    f"epoch {state.epoch + 1:3d}  loss {mean_loss:.4f}  test accuracy {acc:.2f}%  "
                    f"{rate:.0f} samples/s  ({hvd.size()} workers)",
                    flush=True,
                )
            state.epoch, state.batch = state.epoch + 1, 0
            sampler.set_epoch(state.epoch)  # at the end of the epoch (Horovod's rule)
            state.commit()

    train(state)


def main() -> None:
    args = parse_args()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(args.seed + rank)  # different on every rank: broadcast_parameters aligns them
    x_tr, y_tr, x_te, y_te = load_digits(args.seed)
    model = make_model()
    lr = args.lr * size
    server = None
    if args.server_optimizer:
        from trainer_core.optim.server import SGD

        server = SGD(learning_rate=lr, momentum=args.momentum)
    try:
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum),
            named_parameters=model.named_parameters(),
            compression=compression(args.compression, args.threshold),
            server_optimizer=server,
        )
    except ValueError as e:  # a choice this path cannot take (powersgd through servers)
        print(f"train_torch.py: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    if args.elastic:
        train_elastic(args, model, opt, (x_tr, y_tr, x_te, y_te))
        hvd.shutdown()
        return
    mine = torch.arange(rank, len(x_tr), size)  # this worker's shard
    steps = len(mine) // args.batch_size
    gen = torch.Generator().manual_seed(args.seed + 1000 * rank)
    first = resume(args, model, opt, gen) if args.resume and args.checkpoint else 0
    for epoch in range(first, args.epochs):
        start, total = time.perf_counter(), 0.0
        model.train()
        order = mine[torch.randperm(len(mine), generator=gen)]
        for s in range(steps):
            idx = order[s * args.batch_size : (s + 1) * args.batch_size]
            loss = torch.nn.functional.cross_entropy(model(x_tr[idx]), y_tr[idx])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            total += float(loss.detach())
        seconds = time.perf_counter() - start
        model.eval()
        with torch.no_grad():
            acc = float((model(x_te).argmax(1) == y_te).float().mean()) * 100
        mean_loss = torch.tensor([total / max(1, steps)])
        if server is None:  # a server-side optimizer updates every key on the servers: local loss then
            mean_loss = hvd.allreduce(mean_loss)
        if args.checkpoint:  # before the epoch is printed: a printed epoch is a saved one
            checkpoint.save(args.checkpoint, epoch + 1, model, opt, {"generator": gen.get_state()})
        if rank == 0:
            rate = steps * args.batch_size * size / seconds
            print(
                f"epoch {epoch + 1:3d}  loss {float(mean_loss):.4f}  test accuracy {acc:.2f}%  {rate:.0f} samples/s",
                flush=True,
            )
    hvd.shutdown()


if __name__ == "__main__":
    main()
