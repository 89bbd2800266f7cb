"""torchrun's flags given to ``launchkit launch``: instead of click's nearest names (``--nnodes``
suggested ``--nodes``, a Slurm flag; ``--standalone`` got nothing), what does the same here
(docs/migrating-from-torchrun.md). ``TorchrunRefusals`` (launch's command class builds on it) puts the hint into click's refusal."""

from __future__ import annotations

from typing import Any

from launchkit.cli.coercion import Command

_RENDEZVOUS = (
    "nothing to set up: launchkit starts every worker itself and gives each MASTER_ADDR and "
    "MASTER_PORT (--master-port pins the port; the job id is TORCHELASTIC_RUN_ID)"
)
_HOSTS = "the hostfile (-H) lists the hosts, `slots=N` the workers on each; -n is the workers in all"
_ELASTIC = _HOSTS + " (elastic: -n MIN:MAX, docs/elastic.md)"

#: torchrun's flag (dashes) -> what launchkit does instead
TORCHRUN: dict[str, str] = {
    "--nnodes": _ELASTIC,
    "--nproc-per-node": _HOSTS + " (on this machine: -n N alone)",
    "--standalone": "`launchkit launch -n N -s 0 -- python train.py` on this machine is one already",
    "--node-rank": "launchkit starts every host itself, once for the whole job; NODE_RANK is set per host",
    "--master-addr": "worker 0's address is MASTER_ADDR, picked for you; with -s 0, --scheduler-ip names it",
    "--rdzv-backend": _RENDEZVOUS,
    "--rdzv-endpoint": _RENDEZVOUS,
    "--rdzv-id": _RENDEZVOUS,
    "--rdzv-conf": _RENDEZVOUS,
    "--max-restarts": "--max-restarts",
    "--monitor-interval": "launchkit watches every process as it runs and ends the job at the first failure",
    "--role": "--env-worker ROLE_NAME:NAME (the default is torchrun's: default)",
    "--redirects": "--log-dir DIR keeps each process's output (DIR/worker-N.stdout, .stderr)",
    "--tee": "--log-dir DIR keeps each process's output; the console shows every line, prefixed [worker N]",
    "--local-ranks-filter": (
        "every line comes prefixed [worker N]: grep it, or `launchkit logs JOB --role worker --rank N`"
    ),
    "--log-dir": "--log-dir",
    "--no-python": "the command runs as given: `launchkit launch -n 2 -s 0 -- ./run.sh`",
    "--module": "give the command: `launchkit launch -n N -s 0 -- python -m pkg.train`",
    "-m": "give the command: `launchkit launch -n N -s 0 -- python -m pkg.train`",
    "--run-path": "give the command: `launchkit launch -n N -s 0 -- python path/to/train.py`",
    "--start-method": "each worker is a process of its own, started by launchkit",
    "--master-port": "--master-port",
}


def torchrun_hint(option: str) -> str | None:
    """What launchkit does for torchrun's ``option`` (``--nproc_per_node`` as ``--nproc-per-node``);
    None for a flag that is not torchrun's."""
    return TORCHRUN.get(option if option == "-m" else option.replace("_", "-"))


class TorchrunRefusals(Command):
    """``launch``: a torchrun flag is refused (exit 2, as any unknown flag) saying what does the same."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except Exception as exc:  # click's NoSuchOption (its exceptions are typer's private module)
            option = getattr(exc, "option_name", None)
            hint = (
                torchrun_hint(option) if isinstance(option, str) and hasattr(exc, "possibilities") else None
            )
            if hint is not None:
                told = f"No such option: {option}; it is torchrun's: {hint} (docs/migrating-from-torchrun.md)"
                setattr(exc, "message", told)  # noqa: B010 (click's attributes, not typed here)
                setattr(exc, "possibilities", None)  # noqa: B010
            raise
