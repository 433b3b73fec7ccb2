"""The watchdog's teardown as a Slurm task, which Slurm has sent SIGTERM along with every other
process of its step: it adds no SIGTERM of its own (a second one makes torchrun abandon its
shutdown), waits out the grace period and SIGKILLs what is left, keeping the job's status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

WATCHDOG_TEARDOWN = """
import json, os, signal, subprocess, sys, time
sys.path.insert(0, {repo!r})
from fstrain.io.remote.watchdog import Watchdog
marks = {marks!r}
job = ("import os, signal, sys, time\\n"
       "signal.signal(signal.SIGTERM, lambda *_: (open(sys.argv[1], 'a').write('TERM\\\\n'), os._exit(143)))\\n"
       "open(sys.argv[1], 'a').write('ready\\\\n')\\n"
       "time.sleep(60)\\n")
watchdog = Watchdog({{"grace_s": 1}})
watchdog.child = subprocess.Popen([sys.executable, "-c", job, marks], start_new_session=True)
while not (os.path.exists(marks) and open(marks).read()):  # the file exists before its line: wait for it
    time.sleep(0.05)
for how in sys.argv[1:]:
    watchdog.request(how)
print(json.dumps([watchdog.stop_requested, watchdog.teardown(watchdog.stop_requested)]))
"""


@pytest.mark.parametrize(("requests", "asked", "code", "marks"), [
    (["term"], "term", 143, ["ready", "TERM"]),  # the job's SIGTERM is the watchdog's
    (["signalled"], "signalled", 137, ["ready"]),  # Slurm's SIGTERM already reached it: none of ours
    (["signalled", "term"], "signalled", 137, ["ready"]),  # the launcher's later `term` adds none
    (["signalled", "kill"], "kill", 137, ["ready"]),
])
def test_the_watchdog_sends_no_second_sigterm_after_slurms(tmp_path: Path, requests: list[str], asked: str,
                                                           code: int, marks: list[str]) -> None:
    """The watchdog as a Slurm task: Slurm has sent SIGTERM to every process of the step, so it
    only waits out the grace period for the job and SIGKILLs what is left (this job ignores
    nothing: it is never signalled here, so it is killed at the grace)."""
    mark_file = tmp_path / "marks"
    script = WATCHDOG_TEARDOWN.format(repo=str(REPO), marks=str(mark_file))
    result = subprocess.run([sys.executable, "-c", script, *requests], capture_output=True, text=True, timeout=60,
                            check=True)
    assert json.loads(result.stdout) == [asked, code]
    assert mark_file.read_text().split() == marks
    said = "fstrain-watchdog: the job did not end within the 1 s grace period: SIGKILL"
    assert (said in result.stderr) is (asked == "signalled"), result.stderr


@pytest.mark.parametrize("step_id", ["", "0"])
def test_only_a_task_that_slurmstepd_started_counts_as_slurms(step_id: str) -> None:
    """Here the parent is this test's Python, not slurmstepd: SIGTERM stays the watchdog's own
    (tests/slurm/test_slurm_alloc_cancel.py covers a real step)."""
    env = {**os.environ, "SLURM_STEP_ID": step_id, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", "from fstrain.io.remote.watchdog import slurm_task; "
                             "print(slurm_task())"], capture_output=True, text=True, env=env, timeout=60, check=True)
    assert result.stdout.strip() == "False"
