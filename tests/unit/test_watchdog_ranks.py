"""A node's watchdog says when its ranks' processes end while its job runs on (torchrun's agent
waits for the other nodes and closes the rendezvous after its ranks exit): the launcher starts
the finish timeout there and, once no node has a rank left, stops its stall clock. Real processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from fstrain.core.job.spec import SCRIPT_FLAGS
from fstrain.io.remote import source
from fstrain.io.remote.watchdog import BOOTSTRAP, EVENT_PREFIX

# A launcher that starts ranks 4 and 5 (RANK in their environment), waits for them, then lingers.
LAUNCHER = """
import os, subprocess, sys, time
ranks = [subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({s})"], env={**os.environ, "RANK": r})
         for r, s in (("4", 1.5), ("5", 3.0))]
for rank in ranks:
    rank.wait()
time.sleep(3)
"""


def test_the_last_rank_ending_says_the_node_has_none_left() -> None:
    header = {"source": source("watchdog"), "argv": [sys.executable, "-c", LAUNCHER], "env": {}, "run_id": "r",
              "node_rank": 0, "nproc": 2, "grace_s": 1, "heartbeat_timeout_s": 600, "stacks": True,
              "modules": {"stacks": source("stacks")}, "stall_timeout_s": 60}
    watchdog = subprocess.Popen([sys.executable, *SCRIPT_FLAGS, "-c", BOOTSTRAP], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert watchdog.stdin is not None and watchdog.stdout is not None
    events = []
    try:
        watchdog.stdin.write((json.dumps(header) + "\n").encode())
        watchdog.stdin.flush()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(e.get("ranks_ended") for e in events):
            line = watchdog.stdout.readline().decode()
            if not line:
                break
            if line.startswith(EVENT_PREFIX) and "ranks_gone" in line:
                events.append(json.loads(line[len(EVENT_PREFIX):]))
        assert watchdog.poll() is None, "said while the job still runs"
    finally:
        watchdog.stdin.write(b"kill\n")
        watchdog.stdin.close()
        watchdog.wait(timeout=30)
        watchdog.stdout.close()
    assert [e["ranks_gone"] for e in events] == [[4], [5]], events
    assert [e["ranks_ended"] for e in events] == [False, True]
