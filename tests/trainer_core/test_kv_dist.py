"""The dist KV store with real processes: exact sums, splitting, optimizers, async, keys, ranks."""

from __future__ import annotations

import numpy as np
import pytest

from tests.trainer_core.cluster import Job, run_job, worker_script


def assert_clean(job: Job) -> None:
    assert all(code == 0 for code in job.codes().values()), job.outputs()
    assert job.leftover_shm == [], job.leftover_shm


SUMS = """
keys = [0, 1, 'w', 'bias', 12345]
sizes = [7, 1000, 3, 50, 1]
kv.init(keys, [np.zeros(n, np.float32) for n in sizes])
kv.init('mat', np.zeros((40, 30), np.float64))
owners = sorted({p.server for p in kv.meta['mat'].parts})
for step in range(3):
    vals = [np.arange(n, dtype=np.float32) * (kv.rank + 1) + step for n in sizes]
    outs = [np.empty(n, np.float32) for n in sizes]
    kv.push(keys, vals)
    kv.pull(keys, outs)
    m = np.full((40, 30), kv.rank + 0.5 + step)
    mo = np.empty((40, 30))
    kv.pushpull('mat', m, mo)
    single = np.empty(7, np.float32)
    kv.pull(0, single)
    emit(step=step, outs=[o.tolist() for o in outs], mat=mo.tolist(), single=single.tolist(), owners=owners)
"""


@pytest.mark.parametrize(
    ("workers", "servers", "shm"),
    [(1, 1, "1"), (2, 2, "1"), (3, 3, "1"), (4, 2, "1"), (2, 3, "0"), (4, 1, "0")],
)
def test_dist_sync_sums_are_exact(workers: int, servers: int, shm: str) -> None:
    job = run_job(
        worker_script(SUMS), workers, servers, {"PS_SHM": shm, "MXNET_KVSTORE_BIGARRAY_BOUND": "1000"}
    )
    assert_clean(job)
    sizes = [7, 1000, 3, 50, 1]
    tri = sum(r + 1 for r in range(workers))
    for w in job.workers:
        res = w.results()
        assert len(res) == 3
        for r in res:
            step = r["step"]
            for n, out in zip(sizes, r["outs"], strict=True):
                assert out == (np.arange(n, dtype=np.float32) * tri + workers * step).tolist()
            assert np.array_equal(
                np.array(r["mat"]), np.full((40, 30), sum(k + 0.5 + step for k in range(workers)))
            )
            assert r["single"] == r["outs"][0]
            assert r["owners"] == list(range(servers))  # 1200 >= bound: split over every server


def test_big_array_split_and_multi_device_values() -> None:
    body = """
kv.init('big', np.zeros(1001, np.float32))
emit(parts=[(p.server, p.start, p.stop) for p in kv.meta['big'].parts])
a, b = np.ones(1001, np.float32), np.arange(1001, dtype=np.float32)
outs = [np.empty(1001, np.float32), np.empty(1001, np.float32)]
kv.push('big', [a, b])
kv.pull('big', outs)
emit(ok=all(np.array_equal(o, 2 * (a + b)) for o in outs))
"""
    job = run_job(worker_script(body), 2, 3, {"MXNET_KVSTORE_BIGARRAY_BOUND": "100"})
    assert_clean(job)
    for w in job.workers:
        parts, ok = w.results()
        assert parts["parts"] == [[0, 0, 334], [1, 334, 668], [2, 668, 1001]]
        assert ok["ok"] is True


OPTIM = """
spec = json.loads(os.environ['OPT_SPEC'])
kv.set_optimizer(spec)
kv.init(['a', 5], [np.linspace(-1, 1, 12).astype(np.float32), np.ones(2000, np.float32)])
hist = []
for step in range(4):
    g = [np.sin(np.arange(12, dtype=np.float32) + step + kv.rank), np.full(2000, 0.1 * (step - kv.rank), np.float32)]
    outs = [np.empty(12, np.float32), np.empty(2000, np.float32)]
    kv.pushpull(['a', 5], g, outs)
    hist.append([o.tolist() for o in outs])
emit(hist=hist)
"""


def reference(spec: dict, workers: int) -> list[list[np.ndarray]]:
    """The same updates computed here in numpy (MXNet's formulas)."""
    w = [np.linspace(-1, 1, 12).astype(np.float32), np.ones(2000, np.float32)]
    state = [dict(m=np.zeros_like(x), v=np.zeros_like(x), mom=np.zeros_like(x)) for x in w]
    lr, wd = spec["learning_rate"], spec.get("wd", 0.0)
    out = []
    for step in range(4):
        for i in range(2):
            if i == 0:
                g = sum(np.sin(np.arange(12, dtype=np.float32) + step + r) for r in range(workers))
            else:
                g = sum(np.full(2000, 0.1 * (step - r), np.float32) for r in range(workers))
            g_raw = g.astype(np.float32)
            g = g_raw + wd * w[i]
            s = state[i]
            if spec["type"] == "adam":
                b1, b2, eps = 0.9, 0.999, 1e-8
                s["m"] = b1 * s["m"] + (1 - b1) * g
                s["v"] = b2 * s["v"] + (1 - b2) * g * g
                t = step + 1
                w[i] = w[i] - lr * np.sqrt(1 - b2**t) / (1 - b1**t) * s["m"] / (np.sqrt(s["v"]) + eps)
            elif spec.get("nesterov"):  # MXNet's nag_mom_update: the momentum's decay uses the new weight
                mu = spec["momentum"]
                s["mom"] = mu * s["mom"]
                w[i] = w[i] + (1 + mu) * (s["mom"] - lr * g) - s["mom"]
                s["mom"] = s["mom"] - lr * (g_raw + wd * w[i])
            else:
                s["mom"] = spec.get("momentum", 0.0) * s["mom"] - lr * g
                w[i] = w[i] + s["mom"]
        out.append([x.copy() for x in w])
    return out


@pytest.mark.parametrize(
    "spec",
    [
        {"type": "sgd", "learning_rate": 0.1, "momentum": 0.9, "wd": 0.01},
        {"type": "sgd", "learning_rate": 0.05, "momentum": 0.8, "wd": 0.001, "nesterov": True},
        {"type": "adam", "learning_rate": 0.01, "wd": 0.001},
    ],
)
def test_server_side_optimizers_match_numpy(spec: dict) -> None:
    import json

    job = run_job(
        worker_script(OPTIM), 2, 2, {"OPT_SPEC": json.dumps(spec), "MXNET_KVSTORE_BIGARRAY_BOUND": "1000"}
    )
    assert_clean(job)
    ref = reference(spec, 2)
    for w in job.workers:
        (res,) = w.results()
        for step, outs in enumerate(res["hist"]):
            for got, want in zip(outs, ref[step], strict=True):
                np.testing.assert_allclose(np.array(got), want, rtol=2e-5, atol=2e-6)


def test_async_converges() -> None:
    body = """
target = np.linspace(-2, 2, 64).astype(np.float32)
kv.set_optimizer({'type': 'sgd', 'learning_rate': 0.1})
kv.init('w', np.zeros(64, np.float32))
w = np.zeros(64, np.float32)
for step in range(60):
    kv.pushpull('w', w - target, w)
kv.barrier()
kv.pull('w', w)
emit(err=float(np.abs(w - target).max()), rank=kv.rank)
"""
    job = run_job(worker_script(body, "dist_async"), 2, 1)
    assert_clean(job)
    for w in job.workers:
        (res,) = w.results()
        assert res["err"] < 1e-3


def test_rank_matches_launcher_rank_and_errors_are_clear() -> None:
    body = """
errors = []
try:
    kv.pull('never', np.empty(3))
except Exception as exc:
    errors.append(type(exc).__name__ + ': ' + str(exc))
try:
    kv.set_gradient_compression({'type': 'nosuchcodec'})
except Exception as exc:
    errors.append(type(exc).__name__ + ': ' + str(exc))
kv.init(1, np.zeros(2))
try:
    kv.push(1, np.zeros(3))
except Exception as exc:
    errors.append(type(exc).__name__ + ': ' + str(exc))
emit(rank=kv.rank, env=int(os.environ['LAUNCHKIT_ROLE_RANK']), n=kv.num_workers, errors=errors, type=kv.type)
"""
    job = run_job(worker_script(body, "dist_sync_device"), 3, 1, role_ranks=[2, 0, 1])
    assert_clean(job)
    ranks = []
    for w in job.workers:
        (res,) = w.results()
        assert res["rank"] == res["env"]
        assert res["n"] == 3 and res["type"] == "dist_sync_device"
        assert "KVError" in res["errors"][0] and "'never'" in res["errors"][0]
        assert "CompressionError" in res["errors"][1] and "nosuchcodec" in res["errors"][1]
        assert "3 elements" in res["errors"][2]
        ranks.append(res["rank"])
    assert ranks == [2, 0, 1]


def test_interface_binding_verbose_logging_and_tcp_only_path() -> None:
    body = """
kv.init('k', np.zeros(5, np.float32))
out = np.empty(5, np.float32)
kv.pushpull('k', np.ones(5, np.float32), out)
emit(endpoints=[s.endpoint for s in kv.client.book.servers], local=kv.client.same_host, v=out.tolist())
"""
    job = run_job(worker_script(body), 2, 2, {"DMLC_INTERFACE": "lo", "PS_VERBOSE": "2", "PS_SHM": "0"})
    assert_clean(job)
    for w in job.workers:
        (res,) = w.results()
        assert all(e.startswith("tcp://127.0.0.1:") for e in res["endpoints"])
        assert res["local"] == [False, False] and res["v"] == [2.0] * 5
    assert "recv pushpull" in job.of("server")[0].output() + job.of("server")[1].output()
    assert "bound tcp://127.0.0.1:" in job.of("scheduler")[0].output()


def test_kv_create_runs_the_server_and_scheduler_roles() -> None:
    """With autostart at import off, ``kv.create`` runs the role (as MXNet's kvstore.create does)."""
    code = "import trainer_core.kv as k; k.create('dist_sync'); raise SystemExit(5)"
    body = """
kv.init(0, np.zeros(3, np.float32))
out = np.empty(3, np.float32)
kv.pushpull(0, np.ones(3, np.float32), out)
emit(v=out.tolist())
"""
    job = run_job(
        worker_script(body),
        1,
        1,
        {"TRAINER_CORE_AUTOSTART": "0"},
        role_args={"scheduler": ["-c", code], "server": ["-c", code]},
    )
    assert_clean(job)  # exit 0: create() ran the role and ended the process before SystemExit(5)
    assert job.workers[0].results() == [{"v": [1.0, 1.0, 1.0]}]


REUSE = """
n = 300_000  # split over both servers (bound 1000)
kv.init('k', np.zeros(n, np.float32))
kv.init('t', np.zeros((600, 500), np.float32))
a = np.full(n, kv.rank + 1.0, np.float32)
kv.push('k', a)
a[:] = -999.0  # the caller may reuse its array as soon as push returns
b = np.full(n, 10.0 * (kv.rank + 1), np.float32)
kv.push('k', b)  # the next round, queued on the servers behind the other workers' first pushes
b[:] = -999.0
out = np.empty(n, np.float32)
kv.pull('k', out)
t = np.arange(600 * 500, dtype=np.float32).reshape(500, 600).T  # not contiguous
kv.pushpull('t', t)  # no out: the result replaces the pushed array
emit(uniq=np.unique(out).tolist(), t_ok=bool(np.array_equal(t, np.arange(300000, dtype=np.float32).reshape(500, 600).T * kv.num_workers)),
     tcp=[kv.client.sends_directly(s) for s in range(kv.num_servers)], data=[bool(s.data) for s in kv.client.book.servers])
"""


@pytest.mark.parametrize(
    ("shm", "encrypt"),
    [("1", "0"), ("0", "0"), ("0", "1")],  # shared memory; the TCP data channel; CURVE (a private copy)
)
def test_a_pushed_array_may_be_reused_as_soon_as_push_returns(shm: str, encrypt: str) -> None:
    env = {"PS_SHM": shm, "PS_ENCRYPT": encrypt, "MXNET_KVSTORE_BIGARRAY_BOUND": "1000"}
    job = run_job(worker_script(REUSE), 2, 2, env)
    assert_clean(job)
    for w in job.workers:
        (res,) = w.results()
        assert res["uniq"] == [30.0]
        assert res["t_ok"] is True
        assert res["data"] == [encrypt == "0"] * 2  # PS_ENCRYPT=1: servers open no data channel
        assert res["tcp"] == [shm == "0" and encrypt == "0"] * 2


MANY_KEYS = """
keys = list(range(300))
kv.init(keys, [np.zeros(3, np.float32) for _ in keys])
for step in range(2):
    outs = [np.empty(3, np.float32) for _ in keys]
    kv.pushpull(keys, [np.full(3, k + kv.rank, np.float32) for k in keys], outs)
    emit(step=step, ok=all(o.tolist() == [2 * k + 1.0] * 3 for k, o in zip(keys, outs)))
"""


def test_one_call_of_300_keys_on_a_same_host_server() -> None:
    """The first reply hands the worker a buffer per key: 300 descriptors, more than one sendmsg may
    carry (253) and more than one read takes (64), passed in pieces."""
    job = run_job(worker_script(MANY_KEYS), 2, 1, {"PS_SHM": "1"})
    assert_clean(job)
    for w in job.workers:
        assert [r["ok"] for r in w.results()] == [True, True]


ONE_WORKER_PER_PROCESS = """
import json
import numpy as np
from trainer_core import kv as _kv
def emit(**values):
    print('RESULT ' + json.dumps(values), flush=True)
def error_of(call):
    try:
        call()
    except Exception as exc:
        return type(exc).__name__ + ': ' + str(exc)
    return None
kv = _kv.create('dist_sync')
again = _kv.create('dist_sync')
other = error_of(lambda: _kv.create('dist_async'))
kv.init('w', np.zeros(4, np.float32))
kv.pushpull('w', np.ones(4, np.float32), out := np.empty(4, np.float32))
wrong_out = error_of(lambda: kv.pull('w', np.empty(3, np.float32)))
kv.close()
pushed = error_of(lambda: kv.push('w', np.ones(4, np.float32)))
pulled = error_of(lambda: kv.pull('w', np.empty(4, np.float32)))
after = error_of(lambda: _kv.create('dist_sync'))
emit(same=again is kv, other=other, sum=out.tolist(), wrong_out=wrong_out, pushed=pushed, pulled=pulled,
     after=after)
"""


def test_a_process_is_one_worker_and_a_closed_store_says_so() -> None:
    """A second ``create`` of the same type returns the open store (the scheduler would refuse a
    second registration); another type, or one after ``close()``, is refused with the reason; a
    call on a closed store says it is closed (not a socket error)."""
    job = run_job(ONE_WORKER_PER_PROCESS, 2, 1)
    assert_clean(job)
    for w in job.workers:
        (res,) = w.results()
        assert res["same"] is True and res["sum"] == [2.0] * 4
        assert res["other"].startswith("ConfigError: this process is worker ")
        assert (
            "with kvstore 'dist_sync': kv.create('dist_async') cannot make it a second worker" in res["other"]
        )
        assert res["wrong_out"].startswith("KVError: key 'w': the output has 3 elements")
        assert (
            res["pushed"]
            == "KVError: kvstore 'dist_sync' is closed (close() was called): no push after close()"
        )
        assert (
            res["pulled"]
            == "KVError: kvstore 'dist_sync' is closed (close() was called): no pull after close()"
        )
        assert "until its kvstore 'dist_sync' was closed: a process joins a job once" in res["after"]
