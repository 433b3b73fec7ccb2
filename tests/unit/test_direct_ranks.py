"""`--backend direct`: fstrain's own script starts a node's ranks under the node's watchdog. Real
processes on this machine, started as a node's are (the watchdog's header from plan_launches and
watchdog_header, the script written into the run directory): the ranks' environment, their
lines, a failing rank, a stop with its grace, nothing left behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fstrain.core.hosts.hostfile import Host
from fstrain.core.job.spec import DIRECT_SCRIPT, SCRIPT_FLAGS, LaunchJob, plan_launches
from fstrain.core.runs.limits import RunLimits
from fstrain.io.launch import RunOptions, watchdog_header
from fstrain.io.remote.watchdog import BOOTSTRAP, EVENT_PREFIX
from tests.unit.test_watchdog_reaper import alive, marked

RANK = """\
import json, os, signal, sys, time
names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
         "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS", "FSTRAIN_NODE_RANK")
print(json.dumps({n: os.environ.get(n) for n in names}), flush=True)
print("err of " + os.environ["RANK"], file=sys.stderr, flush=True)
folder = sys.argv[1]
def on_term(signum, frame):
    time.sleep(0.3)  # a save on SIGTERM: the grace period lets it finish
    open(os.path.join(folder, "saved-" + os.environ["RANK"]), "w").close()
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
open(os.path.join(folder, "up-" + os.environ["RANK"]), "w").close()
if os.environ["RANK"] == os.environ.get("FAIL_RANK"):
    time.sleep(0.3)
    sys.exit(9)
time.sleep(600)
"""


def start(tmp_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Node 1 of two nodes of 2 and 3 ranks, under its watchdog, as `fstrain launch` starts it."""
    (tmp_path / "rank.py").write_text(RANK)
    job = LaunchJob("direct", (sys.executable, str(tmp_path / "rank.py"), str(tmp_path)), sys.executable,
                    "10.9.9.9", 29511, "r42", env=env or {})
    launch = plan_launches([Host("a"), Host("b")], [2, 3], job)[1]
    options = RunOptions("r42", tmp_path / "run", RunLimits(grace_s=5, heartbeat_timeout_s=600),
                         node_run_dirs=[str(tmp_path / "run0"), str(tmp_path / "run1")])
    watchdog = subprocess.Popen([sys.executable, *SCRIPT_FLAGS, "-c", BOOTSTRAP], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
                                env={**os.environ, "FSTRAIN_TEST_MARK": str(tmp_path), "HOME": str(tmp_path)})
    assert watchdog.stdin is not None
    watchdog.stdin.write((json.dumps(watchdog_header(launch, options)) + "\n").encode())
    watchdog.stdin.flush()
    return watchdog


def wait_for(paths: list[Path], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"not written: {[p.name for p in paths if not p.exists()]}"
        time.sleep(0.05)


def finish(watchdog: subprocess.Popen[bytes], tmp_path: Path) -> tuple[int, list[str], list[str]]:
    """The watchdog's end, its stdin left open (its end of file would stop the job), and its output."""
    assert watchdog.stdin is not None and watchdog.stdout is not None and watchdog.stderr is not None
    try:
        watchdog.wait(timeout=60)
        out, err = watchdog.stdout.read(), watchdog.stderr.read()
    finally:
        for pipe in (watchdog.stdin, watchdog.stdout, watchdog.stderr):
            pipe.close()
        for pid in marked(tmp_path):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    return watchdog.returncode, out.decode().splitlines(), err.decode().splitlines()


def test_every_rank_gets_torchruns_variables_and_a_stop_keeps_its_grace(tmp_path: Path) -> None:
    watchdog = start(tmp_path)
    wait_for([tmp_path / f"up-{rank}" for rank in (2, 3, 4)])
    assert watchdog.stdin is not None
    watchdog.stdin.write(b"term\n")
    watchdog.stdin.flush()
    code, out, err = finish(watchdog, tmp_path)
    assert code == 143, err
    seen = {}
    for line in out:
        tag, _, text = line.partition("]:")
        if text.startswith("{"):
            seen[tag] = json.loads(text)
    assert set(seen) == {"[local0", "[local1", "[local2"}, out
    for local, values in enumerate(seen[f"[local{n}"] for n in range(3)):
        assert values == {"RANK": str(2 + local), "LOCAL_RANK": str(local), "WORLD_SIZE": "5",
                          "LOCAL_WORLD_SIZE": "3", "GROUP_RANK": "1", "MASTER_ADDR": "10.9.9.9",
                          "MASTER_PORT": "29511", "TORCHELASTIC_RUN_ID": "r42", "OMP_NUM_THREADS": "1",
                          "FSTRAIN_NODE_RANK": "1"}
    assert sorted(line for line in err if "err of" in line) == [f"[local{n}]:err of {2 + n}" for n in range(3)]
    # One SIGTERM each (the process group), and the script waited while their handlers saved.
    assert sorted(p.name for p in tmp_path.glob("saved-*")) == ["saved-2", "saved-3", "saved-4"]
    assert not any(line.startswith(EVENT_PREFIX) for line in out), "a stop is no rank failure"
    assert (tmp_path / "run1" / DIRECT_SCRIPT).is_file()  # what ran, for whoever looks at the node
    assert not (tmp_path / "run1" / "ranklogs").exists(), "the rank files go once relayed"
    assert marked(tmp_path) == []


def test_a_failing_rank_is_named_and_ends_the_nodes_other_ranks(tmp_path: Path) -> None:
    watchdog = start(tmp_path, {"FAIL_RANK": "3", "OMP_NUM_THREADS": "4"})
    started = time.monotonic()
    code, out, err = finish(watchdog, tmp_path)
    assert code == 9, err
    events = [json.loads(line[len(EVENT_PREFIX):]) for line in out if line.startswith(EVENT_PREFIX)]
    assert {"rank_exit": {"rank": 3, "local_rank": 1, "exit_code": 9}} in events
    assert sorted(p.name for p in tmp_path.glob("saved-*")) == ["saved-2", "saved-4"]  # ended with SIGTERM
    assert all('"OMP_NUM_THREADS": "4"' in line for line in out if '"RANK"' in line)  # the user's value stays
    assert time.monotonic() - started < 30
    assert not any(alive(pid) for pid in marked(tmp_path))
