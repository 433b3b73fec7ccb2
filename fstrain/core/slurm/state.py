"""A Slurm run's state (``fstrain launch --slurm``), as values: from what Slurm says of its job
and what the run directory's manifest recorded.

Slurm decides while it knows the job (``scontrol show job``); the manifest, which the job's own
``fstrain launch`` writes when it ends, refines the end (a stalled run, the first failed rank's
code) and decides alone once Slurm has forgotten the job (MinJobAge). Pure: the I/O edge
(fstrain/io/runs.py) gathers the inputs.

| Slurm JobState                                                              | state     |
|-----------------------------------------------------------------------------|-----------|
| PENDING, REQUEUED, REQUEUE_HOLD, REQUEUE_FED, RESV_DEL_HOLD                  | pending   |
| CONFIGURING                                                                 | starting  |
| RUNNING, SUSPENDED, COMPLETING, STOPPED, SIGNALING, RESIZING, STAGE_OUT      | running   |
| COMPLETED                                                                   | succeeded |
| FAILED, NODE_FAIL, OUT_OF_MEMORY, BOOT_FAIL, DEADLINE, TIMEOUT, SPECIAL_EXIT | failed    |
| CANCELLED, PREEMPTED, REVOKED                                               | stopped   |
| CANCELLED before it started (no nodes)                                      | stopped, no exit code |
| another state Slurm calls final / not final                                 | failed / running |
| (unknown to Slurm)                                                          | the manifest's end, else lost |

A run that ``fstrain stop`` ended is ``stopped`` whatever Slurm calls the end (the job's script
exits 143 on the SIGTERM, which Slurm records as FAILED). A run the time limit ended (Slurm's
TIMEOUT, or the batch script's mark that the time-limit warning stopped it) says so: "time limit
(--time 00:02:00) reached".
"""

from __future__ import annotations

from fstrain.core.runs.manifest import Manifest
from fstrain.core.runs.runstate import FINAL, RunState, from_manifest
from fstrain.core.slurm.job import JobStatus

PENDING = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
RUNNING = frozenset({"RUNNING", "SUSPENDED", "COMPLETING", "STOPPED", "SIGNALING", "RESIZING", "STAGE_OUT"})
SUCCEEDED = frozenset({"COMPLETED"})
FAILED = frozenset({"FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "TIMEOUT", "SPECIAL_EXIT"})
STOPPED = frozenset({"CANCELLED", "PREEMPTED", "REVOKED"})
# Words for the reason column where Slurm's state alone says why.
_WHY = {"TIMEOUT": "the job reached its time limit (TIMEOUT)", "NODE_FAIL": "a node failed (NODE_FAIL)",
        "OUT_OF_MEMORY": "out of memory (OUT_OF_MEMORY)", "BOOT_FAIL": "a node failed to boot (BOOT_FAIL)",
        "DEADLINE": "the job missed its deadline (DEADLINE)", "PREEMPTED": "preempted by Slurm (PREEMPTED)",
        "SUSPENDED": "suspended by Slurm", "COMPLETING": "Slurm is ending the job (COMPLETING)"}


def slurm_run_state(job: JobStatus | None, manifest: Manifest | None, *,
                    stop_requested: bool = False, time_limit_reached: bool = False, time_limit: str = "") -> RunState:
    """The run's state from its job (``None``: Slurm no longer knows it) and its manifest
    (``None``: not written yet, or the job died before writing it). ``time_limit_reached``: the
    batch script marked that the time-limit warning stopped the run; ``time_limit``: the job's
    TimeLimit, for the words."""
    state = _slurm_run_state(job, manifest, stop_requested)
    if state.state in FINAL and state.state != "succeeded" and not stop_requested and (
            time_limit_reached or (job is not None and job.state == "TIMEOUT")):
        limit = time_limit or (job.time_limit if job is not None else "")
        return RunState("failed", state.exit_code, f"time limit{f' (--time {limit})' if limit else ''} reached",
                        state.ended)
    return state


def _slurm_run_state(job: JobStatus | None, manifest: Manifest | None, stop_requested: bool) -> RunState:
    ended = manifest if manifest is not None and manifest.ended else None  # the job's launcher recorded its end
    if job is None:
        if ended:
            state = from_manifest(ended)
            return _stopped(state) if stop_requested else state
        return RunState("lost", None, "Slurm no longer knows the job and the run directory holds no final "
                                      "manifest")
    if job.state in PENDING:
        return RunState("pending", None, f"waiting in Slurm's queue ({job.reason or job.state})")
    if job.state == "CONFIGURING":
        return RunState("starting", None, "Slurm is starting the nodes (CONFIGURING)")
    if job.state in RUNNING:
        return RunState("running", None, _WHY.get(job.state, ""))
    code = job.shell_exit_code
    if job.state in SUCCEEDED:
        state = RunState("succeeded", code, "")
    elif job.state in STOPPED and not job.nodes and not job.run_time_s and not ended:  # never started: no exit code
        return RunState("stopped", None, f"cancelled before it started ({job.state})")
    elif job.state in STOPPED:
        state = RunState("stopped", code, _WHY.get(job.state, f"cancelled ({job.state})"))
    elif job.state in FAILED:
        state = RunState("failed", code, _WHY.get(job.state, ""))
    else:  # a state this table does not know: Slurm says it is not over
        return RunState("running", None, f"Slurm job state {job.state}") if not job.final else \
            RunState("failed", code, f"Slurm job state {job.state}")
    if ended:  # the job's own launcher recorded the end: a stall, the failing rank's own code
        recorded = from_manifest(ended)
        why = state.reason or ("" if recorded.reason in ("ok", "failed") else recorded.reason)
        if recorded.state == "stalled" or (state.state == "failed" and recorded.state == "failed"):
            exit_code = recorded.exit_code if recorded.exit_code is not None else code
            state = RunState(recorded.state, exit_code, why, recorded.ended)
        else:
            state = RunState(state.state, state.exit_code, why, recorded.ended)
    return _stopped(state) if stop_requested else state


def _stopped(state: RunState) -> RunState:
    """A run `fstrain stop` ended: stopped, with the exit code it ended with."""
    if state.state not in FINAL:
        return state
    return RunState("stopped", state.exit_code, "fstrain stop", state.ended)
