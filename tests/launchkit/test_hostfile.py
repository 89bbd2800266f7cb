from __future__ import annotations

import contextlib
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launchkit.core.hostfile import format_host, parse_hostfile, parse_line, read_hostfile, read_text
from launchkit.core.spec import Host
from launchkit.errors import HostfileError


def one(line: str) -> Host:
    host = parse_line(line)
    assert host is not None
    return host


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("node1", Host("node1")),
        ("node1:2222", Host("node1", port=2222)),
        ("alice@node1", Host("node1", user="alice")),
        ("alice@node1:22", Host("node1", port=22, user="alice")),
        ("10.0.0.5", Host("10.0.0.5")),
        ("10.0.0.5:2200", Host("10.0.0.5", port=2200)),
        ("[fe80::1]:22", Host("fe80::1", port=22)),
        ("[::1]", Host("::1")),
        ("bob@[2001:db8::7]:2022", Host("2001:db8::7", port=2022, user="bob")),
        ("2001:db8::7", Host("2001:db8::7")),
        ("node1 slots=4", Host("node1", slots=4)),
        ("  node1:22   slots=2   # trailing comment", Host("node1", port=22, slots=2)),
        ("gpu-01.cluster.example.com", Host("gpu-01.cluster.example.com")),
        ("node_1", Host("node_1")),
        # Open MPI: max_slots / max-slots (never binding), spaces around '='
        ("node1 slots=2 max_slots=4", Host("node1", slots=2)),
        ("node1 max-slots=4 slots=4", Host("node1", slots=4)),
        ("node1 max_slots=8", Host("node1")),
        ("node1 slots = 2", Host("node1", slots=2)),
        ("node1 slots =2 max-slots= 3", Host("node1", slots=2)),
    ],
)
def test_accepted_forms(line: str, expected: Host) -> None:
    assert one(line) == expected


@pytest.mark.parametrize("line", ["", "   ", "# only a comment", "\t# x"])
def test_blank_and_comment_lines(line: str) -> None:
    assert parse_line(line) is None


def test_windows_line_endings_bom_and_line_numbers() -> None:
    text = "\ufeff# header\r\nnode1\r\n\r\nnode2:22 slots=3\r\n"
    hosts = parse_hostfile(text, "hf")
    assert [(h.name, h.port, h.slots, h.line) for h in hosts] == [
        ("node1", None, None, 2),
        ("node2", 22, 3, 4),
    ]


def test_repeated_host_is_one_more_entry() -> None:
    assert [h.name for h in parse_hostfile("a\nb\na\n")] == ["a", "b", "a"]


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("node1\nnode2:abc\n", 2, "bad port 'abc'"),
        ("node1:0\n", 1, "bad port '0'"),
        ("node1:65536\n", 1, "expected a number from 1 to 65535"),
        ("node1 slots=0\n", 1, "bad slots '0'"),
        ("node1 slots=x\n", 1, "bad slots 'x'"),
        ("node1 slots=2 slots=3\n", 1, "slots given twice"),
        ("\n\nnode1 gpus=2\n", 3, "unknown field 'gpus=2'"),
        ("-oProxyCommand=x\n", 1, "bad host name"),
        ("node1;rm\n", 1, "bad host name"),
        ("a b@c\n", 1, "unknown field"),
        ("@node1\n", 1, "bad user name"),
        ("[fe80::1\n", 1, "without ']'"),
        ("[node1]:22\n", 1, "not an IPv6 address"),
        ("[::1]x\n", 1, "expected ':port'"),
        ("1:2:3:zz\n", 1, "bad host"),
        ("node1:\n", 1, "bad port ''"),
        ("node1 max_slots=0\n", 1, "bad max_slots '0': expected a whole number from 1 to 1000000"),
        ("node1 slots=4 max-slots=2\n", 1, "max_slots=2 is less than slots=4: expected max_slots >= slots"),
        ("node1 max_slots=2 max-slots=2\n", 1, "max_slots given twice on one line"),
        ("node1 slots = x\n", 1, "bad slots 'x'"),
        (
            "node1 gpus=2\n",
            1,
            "unknown field 'gpus=2': expected slots=N (or Open MPI's max_slots=N) after the host",
        ),
    ],
)
def test_bad_lines_name_file_and_line(text: str, line: int, words: str) -> None:
    with pytest.raises(HostfileError) as err:
        parse_hostfile(text, "cluster.hosts")
    assert err.value.line == line
    assert str(err.value).startswith(f"cluster.hosts:{line}: ")
    assert words in str(err.value)


def test_empty_file() -> None:
    with pytest.raises(HostfileError, match="no hosts in file"):
        parse_hostfile("# nothing\n\n", "empty")


def test_read_errors(tmp_path) -> None:
    with pytest.raises(HostfileError, match="no such file"):
        read_hostfile(tmp_path / "missing")
    with pytest.raises(HostfileError, match="is a directory"):
        read_hostfile(tmp_path)
    bad = tmp_path / "latin1"
    bad.write_bytes(b"node1\nn\xe9ud\n")
    with pytest.raises(HostfileError) as err:
        read_hostfile(bad)
    assert err.value.line == 2 and "UTF-8" in str(err.value)


def test_example_hostfiles_parse() -> None:
    hosts = read_hostfile("hostfiles/example")
    assert len(hosts) == 5
    assert hosts[3] == Host("node4", port=2222, user="alice", slots=4, line=hosts[3].line)


@given(
    name=st.from_regex(r"\A[a-z0-9][a-z0-9-]{0,10}(\.[a-z0-9]{1,5}){0,2}\Z"),
    user=st.none() | st.from_regex(r"\A[a-z_][a-z0-9_-]{0,8}\Z"),
    port=st.none() | st.integers(1, 65535),
    slots=st.none() | st.integers(1, 64),
)
def test_format_parse_round_trip(name: str, user: str | None, port: int | None, slots: int | None) -> None:
    host = Host(name, port=port, user=user, slots=slots)
    assert one(format_host(host)) == host


@given(st.ip_addresses(v=6), st.none() | st.integers(1, 65535))
def test_ipv6_round_trip(addr, port) -> None:
    host = Host(str(addr), port=port)
    assert one(format_host(host)) == host


@settings(max_examples=400)
@given(st.text(alphabet=st.characters(), max_size=200))
def test_no_input_gives_a_traceback(text: str) -> None:
    """Any text either parses or raises HostfileError naming the file."""
    try:
        hosts = parse_hostfile(text, "fuzz")
    except HostfileError as exc:
        assert str(exc).startswith("fuzz")
    else:
        assert hosts


@settings(max_examples=300)
@given(st.lists(st.text(alphabet=string.printable, max_size=40), max_size=8))
def test_no_traceback_on_line_soup(lines: list[str]) -> None:
    with contextlib.suppress(HostfileError):
        parse_hostfile("\n".join(lines), "soup")


@given(st.binary(max_size=120))
def test_no_traceback_on_bytes(tmp_path_factory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("hf") / "hosts"
    path.write_bytes(data)
    with contextlib.suppress(HostfileError):
        read_hostfile(path)


@pytest.mark.parametrize(
    ("text", "warned"),
    [
        ("worker-0:2\nworker-1:2\n", [1, 2]),
        ("al@worker-0:4 # Horovod style\n", [1]),
        ("node1:22\nnode2:2222\nnode3:2 slots=1\nnode4\n[::1]:21\n", [5]),
    ],
)
def test_host_colon_small_number_is_a_port_with_a_warning(tmp_path, text: str, warned: list[int]) -> None:
    (tmp_path / "hf").write_text(text)
    heard: list[str] = []
    hosts = read_hostfile(tmp_path / "hf", heard.append)
    assert [h.line for h in hosts if h.port is not None and h.port < 22 and h.slots is None] == warned
    assert [m.split(":")[1] for m in heard] == [str(n) for n in warned]
    if text.startswith("worker-0:2"):
        assert heard[0] == (
            f"{tmp_path / 'hf'}:1: 'worker-0:2' means ssh port 2 (as in MXNet's launch.py), not 2 slots "
            "(Horovod's and mpirun's host:N); for slots write 'worker-0 slots=2'"
        )
    assert hosts[0].port is not None  # still launch.py's meaning


def test_a_file_of_comments_only_parses_to_no_hosts_where_allowed() -> None:
    assert parse_hostfile("# nothing yet\n\n", "h", allow_empty=True) == []
    with pytest.raises(HostfileError, match="no hosts in file"):
        parse_hostfile("# nothing yet\n", "h")


def test_a_hostfile_that_never_ends_is_refused(tmp_path) -> None:
    """-H /dev/zero read until memory ran out (the launch, hosts list and check never answered)."""
    big = tmp_path / "big"
    big.write_text("node1\n" * (3 << 20))  # 18 MiB: first, so that the old code fails here
    with pytest.raises(HostfileError, match="more than 16 MiB"):
        read_text(big)
    for path in ("/dev/zero", "/dev/urandom"):
        with pytest.raises(HostfileError, match=f"{path}: more than 16 MiB: expected a hostfile"):
            read_text(path)
