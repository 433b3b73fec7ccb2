"""A detached run's coordinator in this process (fstrain/io/remote/coordinator.py), built from the
header `launch --detach` sends, and a client that speaks its protocol on loopback."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from fstrain.io.remote import coordinator, watchdog

CORE = Path(coordinator.__file__).resolve().parents[2] / "core"  # the modules start_detached sends
SECRET = "ab" * 16


def make_coordinator(run_dir: Path, nnodes: int = 1, names: list[str] | None = None, events: bool = False,
                     **header: Any) -> coordinator.Coordinator:
    modules = {"supervisor": (CORE / "launch" / "supervisor.py").read_text(),
               "analysis": (CORE / "monitor" / "stacks.py").read_text(),
               "metricline": (CORE / "monitor" / "metricline.py").read_text(),
               "stacks": Path(watchdog.__file__).with_name("stacks.py").read_text(),  # sent with --stall-timeout
               "runctl": Path(watchdog.__file__).with_name("runctl.py").read_text()}  # a node's view
    detach = {"role": "coordinator", "secret": SECRET, "nnodes": nnodes, **({"names": names} if names else {}),
              **({"events": "9.9"} if events else {})}
    node = coordinator.Node({"detach": detach, "run_id": "r", "run_dir": str(run_dir), "modules": modules,
                             **header}, watchdog.Watchdog)
    return coordinator.Coordinator(node)


def ask(port: int, request: dict[str, object]) -> dict[str, object]:
    """One request on a new connection, and the coordinator's one-line answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall((json.dumps(request) + "\n").encode())
        answer: dict[str, object] = json.loads(sock.makefile("rb").readline())
        return answer
