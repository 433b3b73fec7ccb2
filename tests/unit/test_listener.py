"""A listening port on one host (fstrain/io/listener.py), which the launch's rendezvous check
and the doctor both open: on this machine through the local transport, with a real netcheck
listener, so what is checked is the port itself (bound, refused once closed)."""

from __future__ import annotations

import socket
import sys

import pytest

from fstrain.errors import FstrainError
from fstrain.io.listener import start_listener
from fstrain.io.transport.local import LocalTransport


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def connects(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            return True
    except OSError:
        return False


def test_the_first_free_port_is_listened_on_and_free_once_closed() -> None:
    """A busy port is skipped and named; the next one accepts connections until close(), which
    returns only once the port is free again; a second close does nothing."""
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        busy = int(taken.getsockname()[1])
        wanted = free_port()
        listening = start_listener(LocalTransport("a"), sys.executable, [busy, wanted])
        try:
            assert listening.port == wanted and busy in listening.busy
            assert any(i["address"] == "127.0.0.1" for i in listening.opened["interfaces"])
            assert connects(wanted)
        finally:
            listening.close()
        assert not connects(wanted)
        with socket.socket() as again:  # free to bind: what the job does next
            again.bind(("0.0.0.0", wanted))
        listening.close()


def test_every_port_busy_is_an_answer_without_a_port() -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        busy = int(taken.getsockname()[1])
        listening = start_listener(LocalTransport("a"), sys.executable, [busy])
        listening.close()
    assert listening.port is None and listening.busy == (busy,)


def test_an_interpreter_that_cannot_run_the_listener_is_one_error_naming_the_host() -> None:
    """It starts (it is a program) but exits at once without a line on stdout."""
    with pytest.raises(FstrainError) as caught:
        start_listener(LocalTransport("node7"), "/bin/false", [free_port()])
    assert caught.value.message.startswith("the listener on node7 exited ("), caught.value.message
    assert "before opening a port" in caught.value.message and caught.value.where == "node7"
