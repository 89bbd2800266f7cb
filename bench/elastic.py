"""The time from a worker's SIGKILL to the first completed training step after it, side by side on
one small model (``bench/elastic_worker.py``: the elastic tests' model and step), 4 workers on this
machine:

* ``trainer_core``: ``launchkit launch -n 2:4 -s 0`` with ``hvd.elastic`` (the survivors re-form
  in their processes and go on from their last commit, at 3 workers);
* ``torchrun``: ``python -m torch.distributed.run --rdzv-backend c10d --rdzv-endpoint
  localhost:PORT --nnodes 1:4 --nproc-per-node 4 --max-restarts 3`` of a DDP (gloo) script that
  resumes from its snapshot (every worker restarts, at 4 again), with
  ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (below);
* the same with ``--rdzv-conf last_call_timeout=1``: a lone node of ``--nnodes 1:4`` otherwise
  waits the rendezvous' last call (30 s) for more nodes at every round, the restart's included;
* ``launchkit --max-restarts``: ``launchkit launch -n 4 -s 0 --max-restarts 1`` of the same DDP
  script (the whole job restarts after its default 1 s backoff).

Each run waits until every worker has done ``--warm`` steps and trained for 2 s (by then
trainer_core's workers have sent the launcher the figure that keeps them in their processes at a
change), SIGKILLs worker 2 by its pid, and takes the first step completed after the kill by the
group of after the change: a step of a smaller group or of a later attempt. A step that a survivor
completes after the kill with the dead worker's gradient already in (the kill came between that
step's allreduce and its log line) is not recovery and does not count; counting it gave readings
of 0.00 s. A run counts only if it recovered the way its system should (trainer_core: the
launcher says ``in process``; the others: steps of attempt 1).

torchrun 2.13 shares its agent's TCPStore with the workers by default; the store outlives a
restart with the first attempt's keys in it (https://github.com/pytorch/pytorch/issues/135712),
and the restarted workers never complete a step (gloo's ``connectFullMesh`` fails, or they
wait). ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, torch's opt-out (read by its c10d rendezvous
handler), has the workers' rank 0 serve a new store in each rendezvous round.

The systems alternate run by run (forward, then reversed); the per-run figures, their median and
range, and the ratios to both torchrun legs' medians are printed as a markdown table (docs/performance.md).

    python -m bench.elastic [--runs 3] [--warm 20]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKER = str(ROOT / "bench" / "elastic_worker.py")
WORKERS, KILLED = 4, 2
LAUNCHKIT = [sys.executable, "-m", "launchkit", "launch", "--no-dashboard", "--launcher", "local"]
TRAINER_CORE = "trainer_core elastic (-n 2:4)"
PEER = "torchrun --nnodes 1:4 --max-restarts 3"
PEER_NO_WAIT = "the same, --rdzv-conf last_call_timeout=1"
WHOLE_JOB = "launchkit --max-restarts 1"
SYSTEMS = (TRAINER_CORE, PEER, PEER_NO_WAIT, WHOLE_JOB)
TORCHRUN = (PEER, PEER_NO_WAIT)


def argv(name: str, out: Path) -> list[str]:
    env = ["--env", f"OUT:{out}"]
    if name == TRAINER_CORE:
        heartbeat = ["--env", "PS_HEARTBEAT_INTERVAL:0.2", "--env", "PS_HEARTBEAT_TIMEOUT:6"]
        flags = ["-n", "2:4", "-s", "0", "--blacklist-cooldown", "600", *heartbeat]
        return [*LAUNCHKIT, *flags, *env, sys.executable, WORKER, "hvd"]
    if name in TORCHRUN:
        with socket.socket() as s:  # a free port for the c10d rendezvous store
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}"]
        rdzv += ["--rdzv-id", uuid.uuid4().hex]
        elastic = ["--nnodes", "1:4", "--nproc-per-node", str(WORKERS), "--max-restarts", "3"]
        if name == PEER_NO_WAIT:
            rdzv += ["--rdzv-conf", "last_call_timeout=1"]
        return [sys.executable, "-m", "torch.distributed.run", *rdzv, *elastic, WORKER, "ddp"]
    return [
        *LAUNCHKIT,
        "-n",
        str(WORKERS),
        "-s",
        "0",
        "--max-restarts",
        "1",
        *env,
        sys.executable,
        WORKER,
        "ddp",
    ]


def steps(out: Path) -> list[dict]:
    """Every completed step of every worker and attempt (``t``, ``size``, ``attempt``)."""
    return [json.loads(x) for f in out.glob("steps-*") for x in f.read_text().splitlines() if x.endswith("}")]


def first_of(out: Path, index: int) -> list[dict]:
    f = out / f"steps-{index}-0"
    return [json.loads(x) for x in f.read_text().splitlines() if x.endswith("}")] if f.exists() else []


def after_change(step: dict) -> bool:
    """A step of the group after the change: a smaller one (in process) or a later attempt."""
    return step["size"] != WORKERS or step["attempt"] > 0


def wait(pred: Callable[[], bool], timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return False


def warmed(out: Path, warm: int) -> bool:
    """Every worker has done ``warm`` steps over at least 2 s."""
    firsts = [first_of(out, i) for i in range(WORKERS)]
    return all(len(s) >= warm and s[-1]["t"] - s[0]["t"] >= 2 for s in firsts)


def one(name: str, warm: int, timeout: float) -> tuple[float, int]:
    """Seconds from the SIGKILL of worker 2 to the first step after the change, and the step
    (worker 2's count) it was killed after."""
    with tempfile.TemporaryDirectory(prefix="bench-elastic-") as d:
        out = Path(d)
        env = {**os.environ, "OUT": str(out), "LAUNCHKIT_HOME": str(out / "home")}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        if name in TORCHRUN:
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        err = (out / "stderr").open("w+")
        proc = subprocess.Popen(
            argv(name, out), env=env, stdout=subprocess.DEVNULL, stderr=err, text=True, start_new_session=True
        )

        def tail() -> str:
            err.flush()
            return (out / "stderr").read_text()[-3000:]

        try:
            if not wait(lambda: warmed(out, warm), timeout):
                raise RuntimeError(
                    f"no {warm} steps over 2 s on every worker within {timeout:g} s:\n{tail()}"
                )
            at = len(first_of(out, KILLED))
            killed = time.time()
            os.kill(int((out / f"pid-{KILLED}-0").read_text()), signal.SIGKILL)
            if not wait(lambda: any(s["t"] > killed and after_change(s) for s in steps(out)), timeout):
                raise RuntimeError(f"no step after the change within {timeout:g} s of the kill:\n{tail()}")
            first = min(s["t"] for s in steps(out) if s["t"] > killed and after_change(s))
            (out / "stop").write_text("")
            proc.wait(timeout=timeout)
            if proc.returncode != 0:
                raise RuntimeError(f"exit {proc.returncode}:\n{tail()}")
            if name == TRAINER_CORE and "; in process" not in tail():
                raise RuntimeError(f"the launcher did not keep the survivors in their processes:\n{tail()}")
            if name != TRAINER_CORE and not any(s["attempt"] == 1 for s in steps(out)):
                raise RuntimeError(f"no step of a restarted worker:\n{tail()}")
            return first - killed, at
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            end_workers(out)
            err.close()


def end_workers(out: Path) -> None:
    """SIGKILL every worker of the run still alive (a run that failed: torchrun's workers are
    not in its process group), by the pids they wrote, where that pid still runs this bench's
    worker."""
    for f in out.glob("pid-*"):
        pid = int(f.read_text())
        try:
            if WORKER.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
        except (FileNotFoundError, ProcessLookupError):
            pass


def table(got: dict[str, list[float | None]], timeout: float) -> list[str]:
    def median(xs: list[float | None]) -> float | None:
        done = [x for x in xs if x is not None]
        return statistics.median(done) if done else None

    peer, no_wait = median(got[PEER]), median(got[PEER_NO_WAIT])
    runs = len(got[PEER])
    head = " | ".join(f"run {r + 1} s" for r in range(runs))
    rows = [
        f"| system | {head} | median s | range s | ratio to torchrun (medians) | ratio to torchrun,"
        " last_call_timeout=1 (medians) | per-run ratios to torchrun |",
        "|---|" + "---|" * (runs + 5),
    ]
    for name, xs in got.items():
        med = median(xs)
        done = [x for x in xs if x is not None]
        cells = " | ".join("-" if x is None else f"{x:.2f}" for x in xs)
        spread = f"{min(done):.2f}-{max(done):.2f}" if done else "-"
        ratio = f"{med / peer:.3g}x" if med is not None and peer else "-"
        ratio2 = f"{med / no_wait:.3g}x" if med is not None and no_wait else "-"
        per = ", ".join(
            f"{x / p:.3g}" if x is not None and p else "-" for x, p in zip(xs, got[PEER], strict=True)
        )
        rows.append(
            f"| {name} | {cells} | {'-' if med is None else f'{med:.2f}'} | {spread} | {ratio} | {ratio2} | {per} |"
        )
    rows.append(f"# -: no recovery within {timeout:g} s (said on stderr)")
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--warm", type=int, default=20, help="steps every worker does before the kill")
    p.add_argument("--timeout", type=float, default=180.0)
    args = p.parse_args()
    if args.runs < 1 or args.warm < 1 or args.timeout <= 0:
        p.error("--runs and --warm take a number of 1 or more, --timeout a positive number of seconds")
    got: dict[str, list[float | None]] = {n: [] for n in SYSTEMS}
    for r in range(args.runs):
        for name in SYSTEMS if r % 2 == 0 else reversed(SYSTEMS):
            try:
                took, at = one(name, args.warm, args.timeout)
                got[name].append(took)
                print(
                    f"run {r + 1} {name}: {took:.2f} s (killed after step {at})", file=sys.stderr, flush=True
                )
            except RuntimeError as exc:  # (a run that did not recover is a result too: said, kept)
                got[name].append(None)
                print(f"run {r + 1} {name}: {exc}", file=sys.stderr, flush=True)
    print("\n".join(table(got, args.timeout)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
