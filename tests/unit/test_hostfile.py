from __future__ import annotations

from pathlib import Path

import pytest

from fstrain.core.hosts.hostfile import (
    Host,
    check_unique,
    compress_hostlist,
    expand_hostlist,
    hosts_from_environment,
    machine_key,
    parse_filter,
    parse_host_list,
    parse_host_token,
    parse_hostfile,
    select_hosts,
    with_default_slots,
)
from fstrain.errors import InventoryError

REPO = Path(__file__).resolve().parents[2]


def test_deepspeed_hostfile_example() -> None:
    path = REPO / "hostfiles" / "deepspeed-example"
    hosts = parse_hostfile(path.read_text(), str(path))
    assert [(h.name, h.slots) for h in hosts] == [("worker-1", 8), ("worker-2", 8), ("worker-3", 4)]
    assert hosts[2].where.endswith("deepspeed-example:5")


def test_plain_list_example_takes_slots_from_gpus_per_node() -> None:
    path = REPO / "hostfiles" / "plain-example"
    hosts = parse_hostfile(path.read_text(), str(path))
    assert [h.slots for h in hosts] == [None, None, None]
    assert (hosts[2].user, hosts[2].name, hosts[2].port) == ("admin", "gpu-node03", 2222)
    filled = with_default_slots(hosts, 4)
    assert [h.slots for h in filled] == [4, 4, 4]


def test_hostfile_value_wins_over_gpus_per_node() -> None:
    hosts = parse_hostfile("a slots=2\nb\n", "hf")
    assert [h.slots for h in with_default_slots(hosts, 8)] == [2, 8]


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("a slots=2\na slots=4\n", 2, "duplicate host 'a': the same machine as 'a' at hf:1 (a, port 22)"),
        ("a slots=0\n", 1, "slots must be a positive integer, got 0"),
        ("a slots=eight\n", 1, "slots must be a positive integer, got 'eight'"),
        ("a slots = 2\n", 1, "malformed slots"),
        ("a slots=\n", 1, "got ''"),
        ("a gpus=2\n", 1, "expected 'slots=N'"),
        ("# only a comment\n\n", None, "no hosts in hostfile"),
        ("good slots=1\nbad$host slots=1\n", 2, "is not a host name"),
        ("a:99999 slots=1\n", 1, "port must be 1-65535"),
        ("@a slots=1\n", 1, "empty user name"),
        ("a slots=\u00b2\n", 1, "slots must be a positive integer, got '\u00b2'"),
        ("a slots=99999999999999999999999\n", 1, "more than 1024 processes on one host"),
        ("a:\u00b2 slots=1\n", 1, "port must be 1-65535"),
        ("a slots=1\nroot@a slots=1\n", 2, "duplicate host 'root@a': the same machine as 'a' at hf:1"),
        ("a slots=1\nb slots=1\na:22 slots=1\n", 2 + 1, "duplicate host 'a:22': the same machine as 'a' at hf:1"),
        ("u@user@a slots=1\n", 1, "'u@user@a' has more than one '@'"),
        ("u@ slots=1\n", 1, "empty host name in 'u@'"),
        ("-oProxyCommand=x@a slots=1\n", 1, "starts with '-' or holds a shell metacharacter"),
        ("a$(reboot)@a slots=1\n", 1, "starts with '-' or holds a shell metacharacter"),
        (f"{'x' * 64}.example slots=1\n", 1, "too long (64 characters in one label"),
    ],
)
def test_bad_hostfiles_name_file_and_line(text: str, line: int | None, fragment: str) -> None:
    with pytest.raises(InventoryError) as info:
        parse_hostfile(text, "hf")
    message = info.value.one_line()
    assert fragment in message
    assert message.startswith(f"hf:{line}: " if line else "hf: ")
    assert info.value.hint


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        ("a,b,c", ["a", "b", "c"]),
        ("gpu[8-11]", ["gpu8", "gpu9", "gpu10", "gpu11"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("x[1,3],y", ["x1", "x3", "y"]),
        ("plain", ["plain"]),
        # Slurm's own order (`scontrol show hostnames`, slurm-wlm 23.11): the last group
        # fastest, then the first, then the second...
        ("a[1-2]b[1-2]c[1-2]", ["a1b1c1", "a1b1c2", "a2b1c1", "a2b1c2", "a1b2c1", "a1b2c2", "a2b2c1", "a2b2c2"]),
        ("a[1-2]b[1-2]c[1-2]d[1-2]", ["a1b1c1d1", "a1b1c1d2", "a2b1c1d1", "a2b1c1d2", "a1b2c1d1", "a1b2c1d2",
                                     "a2b2c1d1", "a2b2c1d2", "a1b1c2d1", "a1b1c2d2", "a2b1c2d1", "a2b1c2d2",
                                     "a1b2c2d1", "a1b2c2d2", "a2b2c2d1", "a2b2c2d2"]),
        ("a[2,1]b[1-2]", ["a2b1", "a2b2", "a1b1", "a1b2"]),
    ],
)
def test_slurm_hostlist_expansion(expr: str, expected: list[str]) -> None:
    assert expand_hostlist(expr) == expected


@pytest.mark.parametrize(
    ("expr", "fragment"),
    [
        ("node[01-04", "unclosed '['"),
        ("node01-04]", "unmatched ']'"),
        ("node[04-01]", "runs backwards"),
        ("node[a-b]", "bad range"),
        ("node[[1]]", "nested '['"),
        ("", "empty host list"),
        ("node[1-100000000]", "names more than 100,000 hosts"),
        ("a[1-1000]b[1-1000]", "expands to 1,000,000 hosts"),
        ("a[1-60000],b[1-60000]", "expands to more than 100,000 hosts"),
    ],
)
def test_bad_slurm_hostlists(expr: str, fragment: str) -> None:
    with pytest.raises(InventoryError, match=r"--hosts: .*" + fragment.replace("[", r"\[").replace("]", r"\]")):
        expand_hostlist(expr)


def test_compress_is_the_inverse_of_expand_for_display() -> None:
    names = expand_hostlist("node[01-04,07],gpu[8-10],login")
    assert compress_hostlist(names) == "node[01-04,07],gpu[8-10],login"
    assert compress_hostlist(["node3"]) == "node3"


def test_host_list_with_users_and_ports() -> None:
    hosts = parse_host_list("ops@n[1-2]:2200,[fd00::5]:22,fd00::6")
    assert [(h.user, h.name, h.port) for h in hosts] == [
        ("ops", "n1", 2200), ("ops", "n2", 2200), (None, "fd00::5", 22), (None, "fd00::6", None)
    ]
    assert hosts[2].label() == "[fd00::5]:22"


def test_slurm_job_nodelist_environment() -> None:
    assert hosts_from_environment({}) is None
    hosts = hosts_from_environment({"SLURM_JOB_NODELIST": "gpu[001-003]"})
    assert hosts is not None
    assert [h.name for h in hosts] == ["gpu001", "gpu002", "gpu003"]
    assert hosts[0].where == "SLURM_JOB_NODELIST"


def test_duplicate_in_host_list() -> None:
    with pytest.raises(InventoryError, match="duplicate host 'n1': the same machine as 'n1' \\(n1, port 22\\)"):
        parse_host_list("n[1-2],n1")


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("node1", "node1:22"),
        ("node1", "root@node1"),
        ("node1", "NODE1"),
        ("node1.example", "node1.example."),
        ("10.0.0.5", "ops@10.0.0.5:22"),
        ("fd00::5", "[fd00:0:0::5]:22"),
    ],
)
def test_one_machine_named_twice_is_refused_naming_both_lines(first: str, second: str) -> None:
    with pytest.raises(InventoryError) as info:
        parse_hostfile(f"{first} slots=8\nother slots=8\n{second} slots=8\n", "cluster/hosts")
    message = info.value.one_line()
    assert message.startswith(f"cluster/hosts:3: duplicate host '{second.split()[0]}': the same machine as ")
    assert f"'{first}' at cluster/hosts:1 (" in message
    assert "hint: list each machine once" in message


def test_machines_apart_by_port_or_name_are_kept() -> None:
    hosts = parse_hostfile("gw:2201\ngw:2202\ngw\nnode1\nnode10\n10.0.0.5\n10.0.0.50\n", "hf")
    assert [h.label() for h in hosts] == ["gw:2201", "gw:2202", "gw", "node1", "node10", "10.0.0.5", "10.0.0.50"]


def test_machine_key_names_one_machine_one_way() -> None:
    assert machine_key("Node1.", None) == ("node1", 22)
    assert machine_key("FD00:0::5", 2222) == ("fd00::5", 2222)
    assert machine_key("1node", None) == ("1node", 22)  # starts like an address, is a name


def test_check_unique_takes_resolved_keys() -> None:
    hosts = parse_host_list("gpu-a,10.9.8.1:22")
    check_unique(hosts)  # apart by their names
    with pytest.raises(InventoryError, match=r"the same machine as 'gpu-a' \(10.9.8.1, port 22 after the SSH"):
        check_unique(hosts, [("10.9.8.1", 22), ("10.9.8.1", 22)], " after the SSH config")


def _cluster() -> list[Host]:
    return parse_hostfile("h1 slots=4\nh2 slots=4\nh3 slots=2\n", "hf")


def test_include_bare_host_means_all_slots() -> None:
    selected = select_hosts(_cluster(), include="h1:0,1@h3")
    assert [(h.name, h.slot_ids, h.num_selected_slots) for h in selected] == [("h1", (0, 1), 2), ("h3", None, 2)]


def test_exclude_slots_and_hosts() -> None:
    selected = select_hosts(_cluster(), exclude="h1:0@h2")
    assert [(h.name, h.slot_ids) for h in selected] == [("h1", (1, 2, 3)), ("h3", None)]


@pytest.mark.parametrize(
    ("include", "exclude", "fragment"),
    [
        ("h9", None, "unknown host 'h9'"),
        ("h3:2", None, "'h3' has slots 0-1, not 2"),
        (None, "h1@h2@h3", "selects no slot"),
        ("h1", "h2", "cannot be combined"),
        ("h1:x", None, "slot ids must be integers"),
        ("h1@@h2", None, "empty entry"),
        ("h1:\u00b2", None, "slot ids must be integers"),
    ],
)
def test_bad_filters(include: str | None, exclude: str | None, fragment: str) -> None:
    with pytest.raises(InventoryError, match=fragment):
        select_hosts(_cluster(), include=include, exclude=exclude)


def test_filter_slots_on_host_without_known_slots() -> None:
    hosts = parse_hostfile("a\nb\n", "hf")
    with pytest.raises(InventoryError, match="slots of 'a' are unknown"):
        select_hosts(hosts, include="a:0")
    assert [h.name for h in select_hosts(hosts, include="b")] == ["b"]


def test_parse_filter_shape() -> None:
    assert parse_filter("a:1,0,1@b", "--include") == {"a": (0, 1), "b": None}


def test_a_host_named_twice_merges_its_slots_as_deepspeed_does() -> None:
    assert parse_filter("h1:1@h1:0,1", "--include") == {"h1": (0, 1)}
    assert parse_filter("h1:1@h1", "--include") == {"h1": None}  # a bare name: all slots
    selected = select_hosts(_cluster(), include="h1:1@h1:0,1")
    assert [(h.name, h.slot_ids) for h in selected] == [("h1", (0, 1))]
    assert [(h.name, h.slot_ids) for h in select_hosts(_cluster(), exclude="h1:1@h1:3")] == [
        ("h1", (0, 2)), ("h2", None), ("h3", None)]


def test_host_token_forms() -> None:
    assert parse_host_token("u@h:22", "x") == Host("h", "u", 22, where="x")
    assert parse_host_token("ops.team_1-x@h", "x").user == "ops.team_1-x"
    assert parse_host_token("h", "x", 4).slots == 4
    with pytest.raises(InventoryError, match="'user@user@host' has more than one '@'"):
        parse_host_token("user@user@host", "--hosts")
    assert parse_host_token("10.0.0.1", "x").name == "10.0.0.1"
    with pytest.raises(InventoryError, match="unclosed"):
        parse_host_token("[fd00::1:22", "x")
