"""Pure parts: sharding, optimizer specs, config, auth keys, shared-memory segments, host identity."""

from __future__ import annotations

import os

import numpy as np
import pytest

from trainer_core.config import NodeConfig
from trainer_core.errors import ConfigError, OptimizerError
from trainer_core.optim import server as optim
from trainer_core.ps import sharding
from trainer_core.ps.protocol import SCHEMA
from trainer_core.transport import auth, devshm, host


def test_small_keys_spread_evenly_and_big_keys_split() -> None:
    owners = [sharding.split(k, 10, 3, 1000)[0].server for k in range(30)]
    assert sorted(owners.count(s) for s in range(3)) == [10, 10, 10]
    parts = sharding.split("w", 10, 3, 10)
    assert [(p.server, p.start, p.stop) for p in parts] == [(0, 0, 4), (1, 4, 7), (2, 7, 10)]
    assert sharding.split("w", 2, 3, 1) == [sharding.Part(0, 0, 0, 1), sharding.Part(1, 1, 1, 2)]
    assert sharding.server_of("abc", 4) == sharding.server_of("abc", 4)


def test_optimizer_specs_are_validated_plain_data() -> None:
    assert optim.to_spec(optim.SGD(learning_rate=0.5, momentum=0.9))["momentum"] == 0.9
    assert optim.to_spec("nag", learning_rate=0.1, momentum=0.5)["nesterov"] is True
    assert optim.to_spec({"type": "adam"})["beta1"] == 0.9
    for bad in (
        {"type": "lbfgs"},
        {"type": "sgd", "lr": 1},
        {"type": "sgd", "learning_rate": float("nan")},
        {"type": "sgd", "learning_rate": "1"},
    ):
        with pytest.raises(OptimizerError):
            optim.validate(bad)
    with pytest.raises(OptimizerError):
        optim.to_spec(object())


def test_sgd_clip_and_rescale() -> None:
    up = optim.build({"type": "sgd", "learning_rate": 1.0, "rescale_grad": 0.5, "clip_gradient": 1.0})
    w = np.zeros(3, np.float32)
    up.update(w, np.array([10.0, -1.0, 0.5], np.float32), up.create_state(w))
    np.testing.assert_allclose(w, [-1.0, 0.5, -0.25])


def env(**extra: str) -> dict[str, str]:
    base = {
        "DMLC_ROLE": "worker",
        "DMLC_PS_ROOT_URI": "127.0.0.1",
        "DMLC_PS_ROOT_PORT": "9000",
        "DMLC_NUM_SERVER": "1",
        "DMLC_NUM_WORKER": "2",
        "LAUNCHKIT_JOB_SECRET": "s",
    }
    base.update(extra)
    return base


def test_config_defaults_and_errors() -> None:
    cfg = NodeConfig.from_environ(env())
    assert cfg.heartbeat_interval > 0 and 0 < cfg.heartbeat_timeout <= 30
    assert cfg.bigarray_bound == 1_000_000 and cfg.use_shm
    assert (
        NodeConfig.from_environ(env(PS_HEARTBEAT_INTERVAL="0.5", PS_HEARTBEAT_TIMEOUT="2")).heartbeat_timeout
        == 2
    )
    with pytest.raises(ConfigError, match="LAUNCHKIT_JOB_SECRET"):
        NodeConfig.from_environ({k: v for k, v in env().items() if k != "LAUNCHKIT_JOB_SECRET"})
    with pytest.raises(ConfigError, match="PS_HEARTBEAT_TIMEOUT"):
        NodeConfig.from_environ(env(PS_HEARTBEAT_TIMEOUT="abc"))
    with pytest.raises(ConfigError, match="DMLC_NUM_WORKER"):
        NodeConfig.from_environ({k: v for k, v in env().items() if k != "DMLC_NUM_WORKER"})
    with pytest.raises(ConfigError, match="DMLC_NUM_WORKER=0"):
        NodeConfig.from_environ(env(DMLC_NUM_WORKER="0"))


def test_a_job_without_servers_is_a_valid_config_but_not_a_kv_store() -> None:
    """``-s 0`` (DMLC_NUM_SERVER=0): workers and a scheduler only, for collectives; the dist KV store
    says it needs a server instead of waiting for one."""
    from trainer_core.kv.dist import DistKVStore

    cfg = NodeConfig.from_environ(env(DMLC_NUM_SERVER="0"))
    assert cfg.env.num_servers == 0 and cfg.env.num_workers == 2
    assert NodeConfig.from_environ(env(DMLC_NUM_SERVER="0"), role="scheduler").role == "scheduler"
    with pytest.raises(ConfigError, match="DMLC_NUM_SERVER=0"):
        DistKVStore("dist_sync", cfg)


def test_curve_keys_are_derived_from_the_secret() -> None:
    a, b, c = auth.derive_keys("one"), auth.derive_keys("one"), auth.derive_keys("two")
    assert a == b and a.server_public != c.server_public and a.client_secret != c.client_secret
    assert b"one" not in a.server_public + a.client_public


def test_segments_are_removed() -> None:
    factory = devshm.SegmentFactory("unit-test-job", "w0")
    seg = factory.create(64)
    assert os.path.exists(seg.path) and seg.name.startswith(devshm.job_prefix("unit-test-job"))
    other = devshm.Segment(seg.name, 64, create=False)
    seg.view(np.dtype("<f4"), 16)[:] = 3
    assert other.view(np.dtype("<f4"), 16).sum() == 48
    seg.unlink()
    assert not os.path.exists(seg.path)
    other.close()
    seg.close()


def test_rank_assignment_honours_launcher_ranks() -> None:
    from trainer_core.node.scheduler import NodeRecord, assign_ranks
    from trainer_core.transport.memory import MemoryChannel

    peer, other = MemoryChannel.pair(schema=SCHEMA)

    def rec(hint: int) -> NodeRecord:
        return NodeRecord(
            role="worker",
            rank_hint=hint,
            host="h",
            endpoint="",
            host_key="k",
            pid=1,
            local="",
            data="",
            peer=peer,
        )

    recs = [rec(-1), rec(0), rec(-1)]
    assert assign_ranks(recs, 3) is None and [r.rank for r in recs] == [1, 0, 2]
    assert assign_ranks([rec(1), rec(1)], 2) is not None
    assert assign_ranks([rec(5)], 1) is not None
    peer.close()
    other.close()


def test_machine_identity_tells_hosts_and_boots_apart_and_interfaces_resolve() -> None:
    here = host.machine_identity("node-a")
    assert here == host.machine_identity("node-a") != host.machine_identity("node-b")
    with open("/proc/sys/kernel/random/boot_id") as f:
        assert here == f"node-a|{f.read().strip()}"
    assert host.machine_identity(None).startswith(f"{os.uname().nodename}|")
    assert host.interface_address("lo") == "127.0.0.1"
    assert host.bind_and_publish_hosts("lo", "ignored") == ("127.0.0.1", "127.0.0.1")
    with pytest.raises(ConfigError, match="no-such-if0"):
        host.interface_address("no-such-if0")


def test_a_process_not_started_by_a_launcher_is_told_so() -> None:
    """``python train.py`` with kv.create("dist_sync") said only "environment variable
    DMLC_PS_ROOT_PORT is not set"; the reason (no launcher started it) is said where no DMLC_*
    variable is set at all, even with the role given by the caller."""
    plain = {"PATH": "/usr/bin", "HOME": "/root"}
    for role in (None, "worker"):
        with pytest.raises(
            ConfigError, match=r"is not set \(no DMLC_\* variable is set: .*`launchkit launch`"
        ):
            NodeConfig.from_environ(plain, role=role)
    partial = {k: v for k, v in env().items() if k != "DMLC_PS_ROOT_PORT"}
    with pytest.raises(ConfigError, match="DMLC_PS_ROOT_PORT") as info:
        NodeConfig.from_environ(partial)  # a launched process that lacks one: the variable alone
    assert "launchkit launch" not in str(info.value)
