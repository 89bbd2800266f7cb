"""mpirun command lines (pure rendering), line by line, with hostile values."""

from __future__ import annotations

import shlex
import signal

import pytest

from launchkit.backends.engine import split_env
from launchkit.backends.mpi import (
    NOISE,
    MpiOptions,
    end_mark,
    host_slots,
    mpi_env,
    rank_order,
    render,
    rsh_args,
)
from launchkit.backends.mpiflavor import detect_flavor, stop_signal
from launchkit.backends.ssh.options import SshOptions
from launchkit.core.spec import Host, LaunchSpec
from launchkit.errors import UsageError
from tests.launchkit.plans import make_plan

HOSTILE = "a b'c\"$HOME\n`x`"


def plan_for(hosts: tuple[Host, ...], n: int = 2, s: int = 2, command: tuple[str, ...] = ("python3", "t.py")):
    spec = LaunchSpec(
        num_workers=n,
        num_servers=s,
        command=command,
        backend="mpi",
        hosts=hosts,
        env=(("HOSTILE", HOSTILE),),
        cwd="/work dir/$x",
    )
    return make_plan(spec, job_id="j1", secret="topsecret", root_uri="10.0.0.1", root_port=9000)


@pytest.mark.parametrize(
    ("text", "flavor"),
    [
        ("mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/", "openmpi"),
        ("HYDRA build details:\n    Version:                                 4.0.2", "mpich"),
        ("Intel(R) MPI Library for Linux* OS, Version 2021.6 Build 20220227", "intel"),
    ],
)
def test_flavor_from_version_text(text: str, flavor: str) -> None:
    assert detect_flavor(text) == flavor


def test_unknown_flavor_names_what_was_found() -> None:
    with pytest.raises(ValueError, match=r"'Some MPI 1\.0'"):
        detect_flavor("Some MPI 1.0\nmore")


def test_ranks_grouped_by_host_with_slots() -> None:
    plan = plan_for((Host("a"), Host("b"), Host("c")), n=3, s=2)
    ordered = rank_order(plan)
    assert [(t.role, t.rank, t.host.name) for t in ordered] == [
        ("server", 0, "a"),
        ("worker", 1, "a"),
        ("server", 1, "b"),
        ("worker", 2, "b"),
        ("worker", 0, "c"),
    ]
    assert host_slots(ordered) == [("a", 2), ("b", 2), ("c", 1)]


def test_open_mpi_line_passes_variables_by_name_only() -> None:
    plan = plan_for((Host("a"), Host("b")))
    argv = render(
        plan, MpiOptions(flavor="openmpi", as_root=True, python="/py", interface="eth0"), SshOptions()
    )
    text = shlex.join(argv)
    assert "topsecret" not in text and HOSTILE not in text and "10.0.0.1" not in text
    assert argv[:4] == ["mpirun", "-np", "4", "--allow-run-as-root"]
    assert argv[argv.index("--host") + 1] == "a:2,b:2"
    assert argv[argv.index("--wdir") + 1] == "/work dir/$x"
    names = [argv[i + 1] for i, a in enumerate(argv) if a == "-x"]
    assert {"LAUNCHKIT_JOB_SECRET", "HOSTILE", "DMLC_PS_ROOT_URI", "LAUNCHKIT_SHIM_TASKS"} <= set(names)
    assert "DMLC_ROLE" not in names  # differs per task: in the shim's table
    assert argv[argv.index("btl_tcp_if_include") - 1 :][:3] == ["--mca", "btl_tcp_if_include", "eth0"]
    assert argv[-6:] == ["/py", "-m", "launchkit.hostside.shim", "--", "python3", "t.py"]


def test_hydra_line() -> None:
    plan = plan_for((Host("a"), Host("b")))
    argv = render(
        plan, MpiOptions(flavor="mpich", python="/py", interface="ib0", extra=("-v",)), SshOptions()
    )
    assert argv[:7] == ["mpirun", "-n", "4", "-hosts", "a:2,b:2", "-wdir", "/work dir/$x"]
    names = argv[argv.index("-genvlist") + 1].split(",")
    assert "LAUNCHKIT_JOB_SECRET" in names and "topsecret" not in " ".join(argv)
    assert argv[argv.index("-iface") + 1] == "ib0"
    assert argv[argv.index("-v") + 1] == "/py"


def test_secret_never_in_the_table_and_shared_values_go_by_name() -> None:
    plan = plan_for((Host("a"), Host("b")))
    common, own = split_env(rank_order(plan))
    assert common["LAUNCHKIT_JOB_SECRET"] == "topsecret"
    assert all("LAUNCHKIT_JOB_SECRET" not in o for o in own)
    assert {o["DMLC_ROLE"] for o in own} == {"server", "worker"}


def test_ssh_options_for_remote_starts() -> None:
    plan = plan_for((Host("a", port=2222, user="me"), Host("b", port=2222, user="me")))
    args = rsh_args(SshOptions(identity="/k ey", known_hosts="/kh"), rank_order(plan))
    assert args[:6] == ["-i", "/k ey", "-p", "2222", "-l", "me"]
    assert "UserKnownHostsFile=/kh" in args and "BatchMode=yes" in args
    argv = render(plan, MpiOptions(flavor="openmpi", python="/py"), SshOptions(identity="/k ey"))
    assert shlex.split(argv[argv.index("plm_rsh_args") + 1])[:2] == ["-i", "/k ey"]


def test_mixed_ssh_ports_are_refused() -> None:
    plan = plan_for((Host("a", port=22), Host("b", port=2222)))
    with pytest.raises(UsageError, match="same ssh user and port"):
        rsh_args(SshOptions(), rank_order(plan))


def test_a_stop_reaches_every_rank_at_once() -> None:
    """Open MPI forwards SIGUSR2 at once (its SIGTERM only after odls_base_sigkill_timeout): the
    shims take it as SIGTERM; Hydra forwards SIGTERM, and leaves a failed rank's peers to us."""
    plan = plan_for((Host("localhost"),))
    ompi = render(plan, MpiOptions(flavor="openmpi", grace=10), SshOptions())
    assert "LAUNCHKIT_SHIM_NOTIFY" in ompi and "LAUNCHKIT_SHIM_GRACE" in ompi
    assert mpi_env(plan, MpiOptions(flavor="openmpi", grace=10))["LAUNCHKIT_SHIM_GRACE"] == "10"
    assert stop_signal("openmpi") == signal.SIGUSR2 and stop_signal("mpich") is None
    hydra = render(plan, MpiOptions(flavor="mpich"), SshOptions())
    assert "-disable-auto-cleanup" in hydra and "LAUNCHKIT_SHIM_NOTIFY" not in " ".join(hydra)
    assert NOISE.match("mpirun: Forwarding signal 12 to job")


def test_the_shims_end_marks_directory() -> None:
    """The launcher's directory for the shims' end marks reaches every rank by name, and a mark
    read there gives (code, stopped); anything else is not a mark."""
    plan = plan_for((Host("localhost"),))
    for flavor in ("openmpi", "mpich"):
        argv = render(plan, MpiOptions(flavor=flavor, ends="/tmp/e"), SshOptions())
        assert any("LAUNCHKIT_SHIM_ENDS" in a for a in argv) and "/tmp/e" not in argv
    assert mpi_env(plan, MpiOptions(ends="/tmp/e"))["LAUNCHKIT_SHIM_ENDS"] == "/tmp/e"
    assert "LAUNCHKIT_SHIM_ENDS" not in mpi_env(plan, MpiOptions())
    assert end_mark(b"\x1elk 3 x 143 1\n") == (143, True)
    assert end_mark(b"\x1elk 3 x 137 0\n") == (137, False)
    assert [end_mark(b"\x1elk 3 o x 1\n"), end_mark(b""), end_mark(b"\x1elk 3 x\n")] == [None] * 3
