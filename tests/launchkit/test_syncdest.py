"""Where --sync-dst-dir may write (launchkit.core.syncdest): /, the top-level system directories
and a home itself are refused, however the path is spelled, unless the user insists."""

from __future__ import annotations

import pytest

from launchkit.core.syncdest import FORCE_FLAG, check_sync_dst, known_homes, normalize, refusal
from launchkit.errors import UsageError


@pytest.mark.parametrize(
    ("dst", "normal"),
    [
        ("/usr/", "/usr"),
        ("/usr/.", "/usr"),
        ("//", "/"),
        ("//usr", "/usr"),
        ("///usr//", "/usr"),
        ("/./etc", "/etc"),
        ("/home/..", "/"),
        ("/..", "/"),
        ("/srv/job/../x/", "/srv/x"),
        ("~", "~"),
        ("~/", "~"),
        ("~/.", "~"),
        ("~/x/..", "~"),
        ("~/x//y/", "~/x/y"),
        ("~//x/", "~/x"),
        ("~//", "~"),
        ("~/..", "~/.."),
        ("~bob/", "~bob"),
        ("$HOME", "~"),
        ("${HOME}/", "~"),
        ("$HOME/x", "~/x"),
        ("./", "."),
        ("x/..", "."),
        ("job/", "job"),
        ("../..", "../.."),
    ],
)
def test_normalize(dst: str, normal: str) -> None:
    assert normalize(dst) == normal


SYSTEM = "/ /bin /boot /dev /etc /home /lib /lib64 /lib32 /libx32 /libexec /opt /proc /root /run /sbin /srv /sys /tmp"
SYSTEM_DIRS = [*SYSTEM.split(), "/usr", "/var"]


def test_the_known_homes_are_the_launchers_and_the_hostfile_users() -> None:
    assert known_homes([None, "alice", "bob", "alice", "", "..", "a/b"], "/home/me") == (
        "/home/me",
        "/home/alice",
        "/home/bob",
    )


@pytest.mark.parametrize(
    "dst", [*SYSTEM_DIRS, "/usr/", "/usr/.", "//", "/./etc", "/home/..", "//usr//", "/var/log/../"]
)
def test_the_root_and_top_level_system_directories_are_refused(dst: str) -> None:
    why = refusal(dst)
    assert why is not None and why.startswith(dst)
    assert ("the root directory" if normalize(dst) == "/" else "a top-level system directory") in why
    if normalize(dst) != dst:
        assert f"(that is {normalize(dst)})" in why


@pytest.mark.parametrize(
    ("dst", "what"),
    [
        ("~", "is the remote user's home itself"),
        ("~/", "is the remote user's home itself"),
        ("~/.", "is the remote user's home itself"),
        ("~/job/..", "is the remote user's home itself"),
        ("$HOME", "is the remote user's home itself"),
        ("${HOME}", "is the remote user's home itself"),
        ("$HOME/", "is the remote user's home itself"),
        ("~bob", "is bob's home itself"),
        (".", "is the remote user's home itself (a relative path is relative to it)"),
        ("./", "is the remote user's home itself"),
        ("job/..", "is the remote user's home itself"),
        ("~/..", "is above the remote user's home"),
        ("..", "is above the remote user's home"),
        ("../..", "is above the remote user's home"),
    ],
)
def test_the_remote_home_itself_and_above_it_are_refused(dst: str, what: str) -> None:
    why = refusal(dst)
    assert why is not None and what in why


def test_a_known_home_path_is_refused() -> None:
    assert refusal("/home/alice", ["/home/alice"]) == "/home/alice is a home directory itself"
    assert (
        refusal("/home/alice/", ["/home/alice"])
        == "/home/alice/ (that is /home/alice) is a home directory itself"
    )
    assert refusal("/home/alice/job", ["/home/alice"]) is None
    assert refusal("/home/alice", ["~"]) is None  # an unknown home (expanduser's answer) names nothing


@pytest.mark.parametrize(
    "dst",
    [
        "/srv/job",
        "/tmp/mxnet_job/",
        "/usr/local/job",
        "/home/ubuntu/cifar10_dist",
        "~/x",
        "~/x/",
        "job",
        "a/b",
        "~/../shared",
        "../shared",
        "$HOME/x",
        "/data",
        "/homes",
    ],
)
def test_a_directory_of_its_own_is_taken(dst: str) -> None:
    assert refusal(dst) is None
    check_sync_dst(dst, force=False)


def test_the_refusal_says_what_and_which_flag_insists() -> None:
    with pytest.raises(UsageError) as info:
        check_sync_dst("/usr/", force=False)
    msg = info.value.message
    assert msg.startswith("--sync-dst-dir /usr/ (that is /usr) is a top-level system directory: ")
    assert FORCE_FLAG in msg and "~/myjob" in msg and info.value.exit_code == 2


def test_insisting_takes_any_destination_but_needs_one() -> None:
    for dst in [*SYSTEM_DIRS, "~", ".", ".."]:
        check_sync_dst(dst, force=True)
    check_sync_dst(None, force=False)
    with pytest.raises(UsageError, match=f"{FORCE_FLAG} insists on a --sync-dst-dir, and none was given"):
        check_sync_dst(None, force=True)


def test_an_empty_destination_is_refused_even_when_insisting() -> None:
    for force in (False, True):
        with pytest.raises(UsageError, match="--sync-dst-dir '': expected a directory on the hosts"):
            check_sync_dst("", force=force)
