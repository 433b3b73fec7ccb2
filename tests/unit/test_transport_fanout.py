from __future__ import annotations

import json
import shlex
import sys
import threading
import time
from collections.abc import Sequence

import pytest

from fstrain.core.hosts.hostfile import Host
from fstrain.errors import TransportError
from fstrain.io.connect import is_local, make_connector
from fstrain.io.fanout import HostPool
from fstrain.io.transport import CommandResult, FakeTransport, LocalTransport, quote_argv
from fstrain.io.transport.ssh import known_hosts_name, remote_command

HOSTILE = ["a b", "'single'", '"double"', "$(id)", "`id`", "x; rm -rf /", "new\nline", "*", "~", "$HOME", "\\", ""]


def test_local_transport_passes_arguments_literally() -> None:
    code = "import json, sys; print(json.dumps(sys.argv[1:]))"
    result = LocalTransport().run([sys.executable, "-c", code, *HOSTILE])
    assert result.ok
    assert json.loads(result.stdout) == HOSTILE


def test_local_transport_failures() -> None:
    transport = LocalTransport()
    assert transport.run(["sh", "-c", "exit 3"]).exit_code == 3
    assert transport.run(["sh", "-c", "kill -9 $$"]).exit_code == 137
    missing = transport.run(["fstrain-no-such-program"])
    assert missing.exit_code == 127 and "command not found" in missing.stderr
    slow = transport.run(["sleep", "5"], timeout_s=0.2)
    assert slow.exit_code is None and slow.error == "timed out after 0.2 s"
    assert transport.run(["cat"], stdin=b"piped").stdout == "piped"


def test_remote_command_quotes_once_and_round_trips() -> None:
    command = remote_command(["printf", "%s|", *HOSTILE])
    # What the remote login shell sees splits back into exactly the argv we meant.
    assert shlex.split(command) == ["sh", "-c", '"$@"; exit $?', "sh", "printf", "%s|", *HOSTILE]
    with pytest.raises(ValueError):
        quote_argv([])


def test_known_hosts_name_uses_brackets_off_port_22() -> None:
    assert known_hosts_name("h", 22) == "h"
    assert known_hosts_name("h", 2222) == "[h]:2222"


def _echo_responder(argv: Sequence[str], stdin: bytes | None) -> CommandResult:
    return CommandResult(0, " ".join(argv) + "\n", "", 0.0)


def test_pool_reuses_one_connection_per_host_and_keeps_order() -> None:
    made: dict[str, FakeTransport] = {}

    def connect(host: Host) -> FakeTransport:
        assert host.name not in made, "a second connection to the same host"
        made[host.name] = FakeTransport(host.name, _echo_responder)
        return made[host.name]

    hosts = [Host(f"h{i}") for i in range(10)]
    with HostPool(hosts, connect, fanout=3) as pool:
        first = pool.run_all(["uname"])
        second = pool.run_all(lambda h: ["echo", h.name])
    assert [r.host for r in first] == [h.name for h in hosts]
    assert [r.stdout for r in second] == [f"echo h{i}\n" for i in range(10)]
    assert all(len(t.calls) == 2 and t.closed for t in made.values())


def test_pool_reports_unreachable_hosts_and_goes_on() -> None:
    def connect(host: Host) -> FakeTransport:
        if host.name == "down":
            raise TransportError("cannot connect to down:22: Connection refused", "is sshd running?", host.name)
        return FakeTransport(host.name, _echo_responder)

    with HostPool([Host("a"), Host("down"), Host("b")], connect) as pool:
        results = pool.run_all(["true"])
        again = pool.run_all(["true"])
    assert [r.ok for r in results] == [True, False, True]
    assert results[1].exit_code is None
    assert results[1].error == "cannot connect to down:22: Connection refused (hint: is sshd running?)"
    assert again[1].error == results[1].error


def test_pool_bounds_concurrency() -> None:
    lock = threading.Lock()
    running = peak = 0

    def responder(argv: Sequence[str], stdin: bytes | None) -> CommandResult:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.02)
        with lock:
            running -= 1
        return CommandResult(0, "", "", 0.02)

    with HostPool([Host(f"h{i}") for i in range(20)], lambda h: FakeTransport(h.name, responder), fanout=4) as pool:
        results = pool.run_all(["x"])
    assert len(results) == 20 and 1 < peak <= 4


def test_localhost_is_local_unless_user_or_port() -> None:
    assert is_local(Host("localhost"))
    assert not is_local(Host("localhost", port=2222))
    assert not is_local(Host("node1"))
    assert isinstance(make_connector()(Host("localhost")), LocalTransport)


def test_missing_ssh_config_is_an_input_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from fstrain.errors import InputError

    with pytest.raises(InputError, match="SSH config file not found"):
        make_connector(str(tmp_path / "nope"))


def test_open_transport_gives_the_connection_or_raises_the_connect_error_once() -> None:
    attempts: list[str] = []

    def connect(host: Host) -> LocalTransport:
        attempts.append(host.name)
        if host.name == "bad":
            raise TransportError("connection refused", "check sshd on the host", host.name)
        return LocalTransport(host.name)

    good, bad = Host("good"), Host("bad")
    with HostPool([good, bad], connect) as pool:
        assert pool.open_transport(good) is pool.open_transport(good)  # one connection per host
        for _ in range(2):
            with pytest.raises(TransportError) as caught:
                pool.open_transport(bad)
            assert (caught.value.message, caught.value.hint) == ("connection refused", "check sshd on the host")
        assert pool.connect_error(bad) == "connection refused (hint: check sshd on the host)"
    assert attempts == ["good", "bad"]  # one try per host


def test_a_pooled_transport_closed_by_its_user_leaves_the_connection_open() -> None:
    """A detached start closes the transport it is given: a host of the pool as a transport
    runs and starts commands on the pool's connection, which stays open for the next stage and
    is closed once, with the pool."""
    made: dict[str, FakeTransport] = {}

    def connect(host: Host) -> FakeTransport:
        assert host.name not in made, "a second connection to the same host"
        made[host.name] = FakeTransport(host.name, _echo_responder)
        return made[host.name]

    host = Host("h0")
    with HostPool([host], connect) as pool:
        pooled = pool.transport(host)
        assert pooled.host == "h0"
        assert pooled.run(["echo", "one"]).stdout == "echo one\n"
        pooled.close()
        assert not made["h0"].closed
        assert pool.run_one(host, ["echo", "two"]).stdout == "echo two\n"
        with pytest.raises(TransportError, match="cannot stream"):
            pooled.start(["cat"])
    assert made["h0"].closed and len(made["h0"].calls) == 2


def test_a_pooled_transport_streams_on_the_pools_connection() -> None:
    connections: list[LocalTransport] = []

    def connect(host: Host) -> LocalTransport:
        connections.append(LocalTransport(host.name))
        return connections[-1]

    host = Host("localhost")
    with HostPool([host], connect) as pool:
        running = pool.transport(host).start([sys.executable, "-c", "print(input())"])
        running.write(b"through the pool\n")
        running.close_stdin()
        assert [line for stream, line in running.lines() if stream == "stdout"] == ["through the pool"]
        assert running.wait() == (0, None)
        running.close()
        assert pool.run_one(host, ["true"]).exit_code == 0
    assert len(connections) == 1
