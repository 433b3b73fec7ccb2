"""A node lost inside a Slurm allocation: its step's srun has no link check, so the node's
watchdog answers every heartbeat, and a node whose answers stop is lost; its srun, which heeds
no SIGTERM while the node is unreachable, is SIGKILLed here (fstrain/io/slurm.py)."""

from __future__ import annotations

import io
import os
import sys
import time
from pathlib import Path
from typing import cast

from fstrain.core.hosts.hostfile import Host
from fstrain.core.job.spec import SCRIPT_FLAGS, NodeLaunch
from fstrain.core.runs.limits import RunLimits
from fstrain.io.launch import RunOptions, run_nodes
from fstrain.io.remote.watchdog import EVENT_PREFIX
from fstrain.io.slurm import SrunTransport
from fstrain.io.transport.base import Transport

# A node's step as fstrain sees it: a watchdog that answers each heartbeat and stops on "term"
# (exit 143), or a dead node's srun: silent, deaf to SIGINT and SIGTERM, its pid in a file.
ANSWERS = ("import json, sys\n"
           "for line in sys.stdin:\n"
           "    if line.strip() == 'hb': print({prefix!r} + json.dumps({{'hb': True}}), flush=True)\n"
           "    if line.strip() == 'term': sys.exit(143)\n")
SILENT = ("import os, signal, sys, time\n"
          "signal.signal(signal.SIGTERM, signal.SIG_IGN); signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
          "open({pidfile!r}, 'w').write(str(os.getpid())); time.sleep(600)\n")


def test_a_node_whose_watchdog_stops_answering_is_lost_and_its_srun_abandoned(tmp_path: Path) -> None:
    pidfile = tmp_path / "srun.pid"
    scripts = {"node1": ANSWERS.format(prefix=EVENT_PREFIX), "node2": SILENT.format(pidfile=str(pidfile))}
    hosts = [Host("node1"), Host("node2")]
    launches = [NodeLaunch(host, rank, 1, ("torchrun",)) for rank, host in enumerate(hosts)]
    options = RunOptions(run_id="r1", run_dir=tmp_path / "run", limits=RunLimits(grace_s=5, heartbeat_timeout_s=1.5),
                         out=io.StringIO())

    def connect(host: Host) -> Transport:
        return cast("Transport", SrunTransport(host.name, [sys.executable, "-c", scripts[host.name]]))

    started = time.monotonic()
    outcome = run_nodes(launches, connect, "python3", options)
    assert time.monotonic() - started < 60  # not the silent step's 600 s
    assert (outcome.reason, outcome.first_failure) == ("lost", 1)
    assert outcome.detail == "node2 was lost: no heartbeat for 1.5 s"
    node1, node2 = outcome.nodes
    assert node1.exit_code == 143 and node1.error is None  # answered throughout, stopped with the run
    assert node2.exit_code is None and node2.error == "no heartbeat for 1.5 s"
    pid = int(pidfile.read_text())
    for _ in range(50):  # SIGKILLed, and reaped: nothing of the run waits on for the lost node
        if not Path(f"/proc/{pid}").exists():
            break
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists(), os.popen(f"ps -o pid,stat,cmd -p {pid}").read()


def test_the_watchdog_answers_heartbeats_only_when_asked(tmp_path: Path) -> None:
    import json

    from fstrain.io.launch import watchdog_header
    from fstrain.io.remote.watchdog import BOOTSTRAP
    from fstrain.io.transport.local import LocalTransport

    launch = NodeLaunch(Host("localhost"), 0, 1, (sys.executable, "-c", "import time; time.sleep(60)"))
    options = RunOptions(run_id="r1", run_dir=tmp_path / "run", limits=RunLimits(grace_s=2), out=io.StringIO())
    for asked in (True, False):
        header = {**watchdog_header(launch, options), "answer_heartbeats": asked}
        running = LocalTransport().start([sys.executable, *SCRIPT_FLAGS, "-c", BOOTSTRAP])
        running.write((json.dumps(header) + "\nhb\nhb\nterm\n").encode())
        lines = [line for _, line in running.lines()]
        running.wait()
        running.close()
        answers = [line for line in lines if line == EVENT_PREFIX + json.dumps({"hb": True})]
        assert len(answers) == (2 if asked else 0), lines
