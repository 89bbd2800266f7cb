"""trainer_core.torch in real jobs: ``launchkit launch -n N -s S --launcher local`` runs
``tests/trainer_core/torch_job.py`` (the worker) and the test compares what each worker printed with
every other worker's and with one process trained here on the concatenated batch (``torch_job.model``
and ``data``: the same definitions). Each run carries a marker in its environment; afterwards no
process with it may be left."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from typing import Any

import pytest

torch = pytest.importorskip(
    "torch", reason="trainer_core.torch needs torch (the torch extra: pip install -e '.[torch]')"
)

from tests.trainer_core import torch_job  # noqa: E402
from tests.trainer_core.markedjob import REPO, marked_processes, run_marked  # noqa: E402


def run_job(
    *args: str, workers: int = 2, servers: int = 0, timeout: float = 80, env: tuple[str, ...] = ()
) -> tuple[int, str]:
    """Run the worker under the launcher: its exit status and output (asserts nothing is left)."""
    launch_args = ["-n", str(workers), "-s", str(servers)]
    command = [sys.executable, "tests/trainer_core/torch_job.py", *args]
    return run_marked(launch_args, command, "TORCH_JOB_TEST", timeout, env)


def launch(
    *args: str, workers: int = 2, servers: int = 0, timeout: float = 80, env: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """Run the worker under the launcher; every worker's RESULT, by rank (asserts success and that
    nothing is left)."""
    rc, out = run_job(*args, workers=workers, servers=servers, timeout=timeout, env=env)
    assert rc == 0, out
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in out.splitlines() if "RESULT " in line]
    assert sorted(r["rank"] for r in results) == list(range(workers)), out
    return sorted(results, key=lambda r: r["rank"])


def reference(workers: int, steps: int = torch_job.STEPS) -> torch.Tensor:
    """One process, rank 0's starting model, each step on every worker's samples at once."""
    m = torch_job.model(seed=0)
    opt = torch.optim.SGD(m.parameters(), lr=torch_job.LR)
    xs, ys = torch_job.data(workers, steps)
    for x, y in zip(xs, ys, strict=True):
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()
        opt.zero_grad()
    return torch.tensor(torch_job.flat(m))


def same_everywhere(results: list[dict[str, Any]], key: str = "params") -> torch.Tensor:
    for r in results[1:]:
        assert r[key] == results[0][key], f"rank {r['rank']}'s {key} differ from rank 0's"
    return torch.tensor(results[0][key])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_allreduce_path_equals_one_process_on_the_concatenated_batch() -> None:
    """-s 0, 3 workers: broadcast_parameters makes rank 0's model everyone's (each started from its
    own seed), and after the steps every worker holds one process's parameters."""
    results = launch("optimizer", workers=3)
    assert [r["comm"] for r in results] == ["allreduce"] * 3
    assert [r["local"] for r in results] == [[0, 3], [1, 3], [2, 3]]
    torch.testing.assert_close(same_everywhere(results), reference(3), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_allreduce_path_in_a_job_with_servers_keeps_the_kv_store_beside_it() -> None:
    """-n 2 -s 1, init(path="allreduce"): the optimizer's operations go through the collectives
    (one process's parameters after the steps) and kv.create("dist_sync") in the same process is
    the store on the worker's one registration (a second would be refused by the scheduler)."""
    results = launch("optimizer", "--path", "allreduce", "--kv-too", workers=2, servers=1)
    assert [r["comm"] for r in results] == ["allreduce"] * 2
    assert [r["kv_too"] for r in results] == [[3.0, 3.0, 3.0]] * 2  # 1 + 2: both workers' pushes
    torch.testing.assert_close(same_everywhere(results), reference(2), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_accumulated_backward_passes_equal_one_process() -> None:
    results = launch("optimizer", "--accum", "2")
    torch.testing.assert_close(same_everywhere(results), reference(2), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_unused_parameters_with_fp16_compression() -> None:
    """Only rank 0 uses ``extra``: the others send zeros for it, and all end with the same values."""
    results = launch("optimizer", "--unused", "--compression", "fp16")
    same_everywhere(results)
    extra = same_everywhere(results, "extra")
    torch_job.model(seed=0)
    start = torch.cat([p.detach().reshape(-1) for p in torch.nn.Linear(6, 3).parameters()])  # rank 0's
    assert not torch.allclose(extra, start)  # moved on every rank, by rank 0's gradient alone


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_onebit_with_error_feedback_trains() -> None:
    plain = launch("optimizer", "--steps", "30", "--fixed")
    onebit = launch("optimizer", "--compression", "1bit", "--steps", "30", "--fixed")
    same_everywhere(onebit)
    first, last, full = onebit[0]["losses"][0], onebit[0]["losses"][-1], plain[0]["losses"][-1]
    assert last < 0.6 * first and last < 1.5 * full, (first, last, full)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("server_optimizer", "autostart"), [(False, "1"), (True, "0")], ids=["sum", "server-sgd"]
)
def test_parameter_server_path_equals_one_process(server_optimizer: bool, autostart: str) -> None:
    """-s 1: gradients through the KV store; with a server-side SGD the servers update the weights
    (MXNet's update_on_kvstore) and the workers pull them. The scheduler and the server run the same
    script: ``import trainer_core`` serves their role, or with ``TRAINER_CORE_AUTOSTART=0``, ``init()``."""
    args = ["optimizer", *(["--server-optimizer"] if server_optimizer else [])]
    results = launch(*args, servers=1, env=(f"TRAINER_CORE_AUTOSTART:{autostart}",))
    assert [r["comm"] for r in results] == ["ps", "ps"]
    torch.testing.assert_close(same_everywhere(results), reference(2), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_parameter_server_path_with_compression_keeps_tensor_operations_exact() -> None:
    """-s 1 with 1-bit gradients: the store compresses every float key, but allreduce, broadcast and
    allgather (made after the compression was set) travel as bytes and stay exact; training goes on."""
    results = launch("optimizer", "--compression", "1bit", "--steps", "20", "--fixed", servers=1)
    same_everywhere(results)
    probes = [torch.linspace(-1, 1, 1001) * (r + 1.2345) for r in range(2)]
    for r in results:
        torch.testing.assert_close(torch.tensor(r["ops"]["sum"]), probes[0] + probes[1], rtol=0, atol=0)
        assert r["ops"]["bcast"] == probes[1].tolist()
        assert r["ops"]["gather"] == torch.cat([probes[0][:1], probes[1][:2]]).tolist()
    losses = results[0]["losses"]
    assert losses[-1] < 0.7 * losses[0], losses


@pytest.mark.timeout(120)
def test_powersgd_on_the_parameter_server_path_is_refused() -> None:
    """The KV store's keys are flat and PowerSGD sends arrays of fewer than two dimensions raw: on
    -s 1 it sent every gradient in 32 bits, silently (the same loss as none). Now a clear error."""
    rc, out = run_job("optimizer", "--compression", "powersgd", servers=1)
    assert rc != 0, out
    assert "Compression.powersgd needs comm='allreduce'" in out, out
    assert "RESULT " not in out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("compression", "tol"), [("none", 1e-6), ("fp16", 2e-3), ("1bit", None), ("powersgd", None)]
)
def test_ddp_comm_hook_equals_ddp_allreduce(compression: str, tol: float | None) -> None:
    """A DDP model over a gloo process group: its buckets through trainer_core's hook give gloo's
    parameters (to float tolerance; fp16 to half precision's); compressed with error feedback, every
    rank holds the same trained parameters."""
    results = launch("ddp", "--port", str(free_port()), "--compression", compression)
    gloo, hook = same_everywhere(results, "gloo"), same_everywhere(results, "hook")
    if tol is not None:
        torch.testing.assert_close(hook, gloo, rtol=tol, atol=tol)
    assert not torch.equal(hook, torch.tensor(torch_job.flat(torch_job.model(seed=0))))
    assert not torch.equal(gloo, torch.tensor(torch_job.flat(torch_job.model(seed=0))))  # it trained


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize(("servers", "args"), [(0, ("--compression", "1bit")), (1, ("--server-optimizer",))])
def test_the_example_trains(servers: int, args: tuple[str, ...]) -> None:
    """examples/train_torch.py (a Horovod script with its import changed) learns the digits."""
    pytest.importorskip("sklearn")
    marker = f"TORCH_EXAMPLE_TEST={uuid.uuid4().hex}"
    cmd = [
        sys.executable,
        "-m",
        "launchkit",
        "launch",
        "-n",
        "2",
        "-s",
        str(servers),
        "--launcher",
        "local",
        "--env",
        marker.replace("=", ":"),
        sys.executable,
        "examples/train_torch.py",
        "--epochs",
        "5",
        *args,
    ]
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=140, check=False)
    finally:
        for pid in marked_processes(marker):
            os.kill(pid, signal.SIGKILL)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    acc = [float(m) for m in re.findall(r"test accuracy ([\d.]+)%", out)]
    assert len(acc) == 5 and acc[-1] >= 80.0, out


def test_the_examples_help_is_whole_and_an_unwritable_checkpoint_is_refused_before_training(
    tmp_path: Any,
) -> None:
    """--help ends its description with the sentence; a --checkpoint no file can be written to is a
    usage error (exit 2) before anything starts, not torch's traceback after an epoch."""
    example = [sys.executable, "examples/train_torch.py"]
    shown = subprocess.run([*example, "--help"], cwd=REPO, capture_output=True, text=True, check=True)
    assert "(8x8 images, no download)." in " ".join(shown.stdout.split())
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    refused = subprocess.run(
        [*example, "--checkpoint", str(blocker / "ck" / "run.ck")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "LAUNCHKIT_"))},
    )
    assert refused.returncode == 2, refused.stderr
    assert f"--checkpoint {blocker / 'ck' / 'run.ck'}: cannot write in {blocker / 'ck'}: " in refused.stderr
    assert "Traceback" not in refused.stderr


def test_resume_without_a_checkpoint_is_refused() -> None:
    """``--resume`` alone trained from scratch, saying nothing."""
    refused = subprocess.run(
        [sys.executable, "examples/train_torch.py", "--resume"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "LAUNCHKIT_"))},
    )
    assert refused.returncode == 2, refused.stderr
    assert "--resume continues from --checkpoint PATH: give it too" in refused.stderr
