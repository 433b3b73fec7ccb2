"""`launch --slurm` batch jobs as a Slurm admin expects them, as values: the CPUs a job asks for,
a time-limit warning that fits --time and is named as the end, one folder per job of a script,
one named Pyxis container with the working and run directories mounted, nothing left by a
refused sbatch, and no `pending (None)`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fstrain.core.slurm.job import (
    JobStatus,
    SbatchOptions,
    cpus_per_task_from_env,
    parse_scontrol_job,
    pyxis_args,
    render_sbatch,
    srun_step_argv,
    time_limit_s,
)
from fstrain.core.slurm.state import slurm_run_state
from fstrain.errors import InputError
from tests.helpers import REPO, manifest, run_fstrain

FIXTURES = REPO / "tests" / "fixtures" / "slurm-runs"
NO_SLURM = {"SLURM_JOB_ID": "", "SLURM_JOB_NODELIST": ""}


def options(**changes: object) -> SbatchOptions:
    base: dict[str, object] = {"nodes": 2, "job_name": "fstrain-r1", "output": "/runs/r1/slurm-%j.out"}
    base.update(changes)
    return SbatchOptions(**base)  # type: ignore[arg-type]


def render(opts: SbatchOptions, run_dir: str = "/runs/r1", launch: tuple[str, ...] = ("fstrain", "launch")) -> str:
    return render_sbatch(opts, launch_argv=list(launch), workdir="/home/me", run_id="r1", run_dir=run_dir,
                         step_prefix=srun_step_argv("NODE", cpus_per_task=opts.cpus_per_task))


def rendered(tmp_path: Path, *args: str) -> str:
    result = run_fstrain("render", "--slurm", "-o", str(tmp_path / "job"), *args, "--", "true", env=NO_SLURM)
    assert result.returncode == 0, result.stderr
    return (tmp_path / "job" / "sbatch.sh").read_text()


# -- CPUs and GPUs ------------------------------------------------------------------------------


def test_the_job_asks_for_the_cpus_of_every_rank_of_a_node(tmp_path: Path) -> None:
    # A 2 x 2 job asked for one CPU per node: --cpus-per-task = ranks per node x 4 by default.
    script = rendered(tmp_path, "--nodes", "2", "--nproc-per-node", "2")
    assert "#SBATCH --cpus-per-task=8" in script and "#SBATCH --ntasks-per-node=1" in script
    # ... and every srun step of the job says so too (srun 22.05-23.02 does not read it from the job).
    assert "--cpus-per-task=8" in next(line for line in script.splitlines() if line.startswith("#   srun"))
    assert "#SBATCH --cpus-per-task=12" in rendered(tmp_path, "--gpus-per-node", "4", "--cpus-per-rank", "3")
    assert "#SBATCH --cpus-per-task=4" in rendered(tmp_path)  # ranks unknown: one rank's worth


def test_gpus_are_asked_per_node_and_gres_passes_verbatim(tmp_path: Path) -> None:
    script = rendered(tmp_path, "--gpus-per-node", "8")
    assert "#SBATCH --gpus-per-node=8" in script and "#SBATCH --cpus-per-task=32" in script
    # A site without the gpu TRES: --gres through --sbatch-arg, the ranks with --nproc-per-node.
    gres = rendered(tmp_path, "--sbatch-arg=--gres=gpu:4", "--nproc-per-node", "4")
    assert "#SBATCH --gres=gpu:4" in gres and "--gpus-per-node" not in gres and "--cpus-per-task=16" in gres


def test_cpus_options_are_checked() -> None:
    with pytest.raises(InputError, match="CPUs per node must be 1 or more"):
        render(options(cpus_per_task=0))
    bad = run_fstrain("launch", "--cpus-per-rank", "2", "--", "true", env=NO_SLURM)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --cpus-per-rank: --cpus-per-rank is an sbatch option")


def test_steps_take_the_cpus_the_job_holds_per_task() -> None:
    assert "--cpus-per-task=16" in srun_step_argv("n1", cpus_per_task=16)
    assert not any(a.startswith("--cpus-per-task") for a in srun_step_argv("n1"))
    assert cpus_per_task_from_env({"SLURM_CPUS_PER_TASK": "16"}) == 16
    assert cpus_per_task_from_env({"SLURM_CPUS_PER_TASK": ""}) is None
    assert cpus_per_task_from_env({}) is None


# -- the time limit -----------------------------------------------------------------------------


@pytest.mark.parametrize(("time", "seconds"), [
    ("30", 1800), ("2", 120), ("1:30", 90), ("2:00:00", 7200), ("1-12", 129600), ("1-12:30", 131400),
    ("1-0:0:5", 86405), ("UNLIMITED", None),
])
def test_time_limit_in_seconds(time: str, seconds: int | None) -> None:
    assert time_limit_s(time) == seconds


@pytest.mark.parametrize(("time", "signal"), [
    (None, "B:USR1@90"), ("2", "B:USR1@30"), ("4", "B:USR1@60"), ("10:00", "B:USR1@90"), ("UNLIMITED", "B:USR1@90"),
])
def test_the_warning_fits_the_time_limit(time: str | None, signal: str) -> None:
    assert f"#SBATCH --signal={signal} " in render(options(time=time))


@pytest.mark.parametrize("time", ["1", "1:59", "0"])
def test_a_time_limit_too_short_for_a_job_is_one_line(time: str) -> None:
    with pytest.raises(InputError, match=f"--time {time} is shorter than the 2 minutes"):
        render(options(time=time))


def test_the_end_by_the_time_limit_is_named() -> None:
    # The warning's SIGTERM made the script exit 143 (Slurm: FAILED); the script marked why.
    ended = manifest(started=1.0, ended=2.0, reason="terminated", exit_code=143)
    failed = JobStatus("42", "FAILED", 143, 0, nodes="node[1-2]", run_time_s=95, time_limit="00:02:00")
    state = slurm_run_state(failed, ended, time_limit_reached=True)
    assert (state.state, state.exit_code, state.reason) == ("failed", 143, "time limit (--time 00:02:00) reached")
    assert slurm_run_state(failed, ended).reason != state.reason  # without the mark: not the time limit
    # Slurm's own TIMEOUT (captured), named the same way.
    timeout = parse_scontrol_job(json.loads((FIXTURES / "timeout.json").read_text())["output"])
    assert slurm_run_state(timeout, None).reason == "time limit (--time 00:01:00) reached"
    # `fstrain stop` came first: that is the end.
    assert slurm_run_state(failed, ended, stop_requested=True, time_limit_reached=True).reason == "fstrain stop"


def test_the_script_marks_the_time_limit_in_the_jobs_folder(tmp_path: Path) -> None:
    program = ("import signal,sys,time\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(143))\n"
               "open(sys.argv[1], 'w').close()\ntime.sleep(60)\n")
    ready = tmp_path / "ready"
    script = render_sbatch(options(time="10"), launch_argv=["python3", "-c", program, str(ready)],
                           workdir=str(tmp_path), run_id="r1", run_dir=str(tmp_path), step_prefix=["srun"])
    (tmp_path / "sbatch.sh").write_text(script)
    proc = subprocess.Popen(["bash", str(tmp_path / "sbatch.sh")], env={**os.environ, "SLURM_JOB_ID": "12"},
                            stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(200):
            if ready.exists():
                break
            subprocess.run(["sleep", "0.05"], check=True)
        proc.send_signal(10)  # SIGUSR1, Slurm's warning
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 143
    assert "the time limit of Slurm job 12 is near: stopping the run" in out
    assert (tmp_path / "job-12" / "time-limit").is_file()


# -- one folder per job -------------------------------------------------------------------------


def test_each_job_of_the_script_keeps_its_own_folder(tmp_path: Path) -> None:
    """The script submitted twice: each job's fstrain writes under RUN_DIR/job-<job id>."""
    program = "import sys; from pathlib import Path; d = Path(sys.argv[-1]); (d / 'manifest.json').write_text(d.name)"
    script = render_sbatch(options(), launch_argv=["python3", "-c", program], workdir=str(tmp_path), run_id="r1",
                           run_dir=str(tmp_path / "run dir"), step_prefix=["srun"])
    (tmp_path / "sbatch.sh").write_text(script)
    for job_id in ("12", "35"):
        done = subprocess.run(["bash", str(tmp_path / "sbatch.sh")], env={**os.environ, "SLURM_JOB_ID": job_id},
                              check=False, timeout=30)
        assert done.returncode == 0
    assert (tmp_path / "run dir" / "job-12" / "manifest.json").read_text() == "job-12"
    assert (tmp_path / "run dir" / "job-35" / "manifest.json").read_text() == "job-35"
    unset = subprocess.run(["bash", str(tmp_path / "sbatch.sh")], env={k: v for k, v in os.environ.items()
                                                                      if not k.startswith("SLURM_")},
                           capture_output=True, text=True, check=False, timeout=30)
    assert unset.returncode != 0 and "run this script with sbatch" in unset.stderr


def test_a_job_id_of_a_second_submission_finds_that_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fstrain.io.runs import find_run, record_slurm

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    run_dir = tmp_path / "run"
    for job_id, code in (("12", 0), ("35", 7)):
        (run_dir / f"job-{job_id}").mkdir(parents=True)
        (run_dir / f"job-{job_id}" / "manifest.json").write_text(json.dumps({"run_id": "r1", "exit_code": code}))
    record_slurm(run_dir, run_id="r1", job_id="12", script=run_dir / "sbatch.sh", output=run_dir / "slurm-12.out",
                 grace_s=5.0)
    first, second = find_run("12"), find_run("35")
    assert first.manifest is not None and second.manifest is not None
    assert (first.run_id, first.job_dir, first.manifest.exit_code) == ("r1", run_dir / "job-12", 0)
    assert (second.run_id, second.job_dir, second.manifest.exit_code) == ("r1", run_dir / "job-35", 7)
    assert second.slurm is not None and second.slurm.output == str(run_dir / "slurm-35.out")
    assert second.slurm_path == run_dir / "job-35" / "slurm.json"  # a stop of job 35 is recorded there
    assert find_run("r1").job_dir == run_dir / "job-12"
    with pytest.raises(InputError, match="no run '36'"):
        find_run("36")


# -- Pyxis --------------------------------------------------------------------------------------


def test_pyxis_steps_share_one_named_container_with_the_directories_mounted() -> None:
    args = pyxis_args("img.sqsh", "/data:/data", name="fstrain-r1", default_mounts=("/home/me/proj", "/scratch/r1"))
    assert args == ["--container-image=img.sqsh", "--container-name=fstrain-r1",
                    "--container-mounts=/data:/data,/home/me/proj:/home/me/proj,/scratch/r1:/scratch/r1"]
    # Mounted already (the same path, or a folder above it): not twice.
    assert pyxis_args("img", "/home/me:/home/me", name="n", default_mounts=("/home/me", "/home/me/proj/runs/r1")) == [
        "--container-image=img", "--container-name=n", "--container-mounts=/home/me:/home/me"]
    assert pyxis_args("img", None, name="n") == ["--container-image=img", "--container-name=n"]
    assert pyxis_args(None, None, name="n", default_mounts=("/a",)) == []


def test_the_batch_script_shows_the_named_container_and_its_mounts(tmp_path: Path) -> None:
    step = next(line for line in rendered(tmp_path, "--container-image", "nvcr.io#nvidia/pytorch:24.05",
                                          "--container-mounts", "/data:/data").splitlines()
                if line.startswith("#   srun"))
    job_dir = f"{tmp_path / 'job'}/job-JOB_ID"
    assert "--container-name=fstrain-RUN_ID" in step
    assert f"--container-mounts=/data:/data,{REPO}:{REPO},{job_dir}:{job_dir}" in step
    plain = next(line for line in rendered(tmp_path, "--container-image", "img", "--no-default-mounts").splitlines()
                 if line.startswith("#   srun"))
    assert "--container-mounts" not in plain and "--container-name=fstrain-RUN_ID" in plain


def test_the_launch_inside_the_job_names_its_container_and_mounts() -> None:
    from fstrain.api.launch import container_step_args
    from fstrain.api.requests import LaunchRequest

    request = LaunchRequest(container_image="img", container_mounts="/d:/d")
    assert container_step_args(request, "20261201-1", "/w", "/w2/r") == [
        "--container-image=img", "--container-name=fstrain-20261201-1", "--container-mounts=/d:/d,/w:/w,/w2/r:/w2/r"]
    off = LaunchRequest(container_image="img", container_default_mounts=False)
    assert container_step_args(off, "x", "/w", "/r") == ["--container-image=img", "--container-name=fstrain-x"]


# -- a refused sbatch, a job cancelled while pending, the first state ----------------------------


def fake_sbatch(folder: Path) -> dict[str, str]:
    """An sbatch that refuses as Slurm does for a partition that does not exist."""
    folder.mkdir()
    (folder / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: invalid partition specified: nope' >&2\n"
                                   "echo 'sbatch: error: Batch job submission failed: Invalid partition name "
                                   "specified' >&2\nexit 1\n")
    (folder / "sbatch").chmod(0o755)
    return {**NO_SLURM, "PATH": f"{folder}:{Path(sys.executable).parent}:/usr/bin:/bin"}


def test_a_refused_sbatch_leaves_nothing_behind(tmp_path: Path) -> None:
    env = {**fake_sbatch(tmp_path / "bin"), "HOME": str(tmp_path / "home")}
    result = run_fstrain("launch", "--slurm", "--partition", "nope", "--env", "A=1", "--run-dir",
                         str(tmp_path / "run"), "--", "true", env=env)
    assert result.returncode != 0 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: sbatch: sbatch refused the job: Batch job submission failed: "
                                    "Invalid partition name specified")
    assert not (tmp_path / "run").exists()
    assert not (tmp_path / "home" / ".fstrain" / "launched").is_dir() or \
        not list((tmp_path / "home" / ".fstrain" / "launched").iterdir())
    # A folder that was there stays, with what was in it; only what the launch wrote goes.
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    again = run_fstrain("launch", "--slurm", "--partition", "nope", "--run-dir", str(tmp_path / "mine"), "--",
                        "true", env=env)
    assert again.returncode != 0
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]


def test_a_job_cancelled_while_pending_has_no_exit_code(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from fstrain.cli.slurm import report_job

    cancelled = parse_scontrol_job(json.loads((FIXTURES / "cancelled-pending.json").read_text())["output"])
    state = slurm_run_state(cancelled, None)
    assert (state.state, state.exit_code, state.reason) == ("stopped", None, "cancelled before it started (CANCELLED)")
    assert report_job(cancelled.job_id, cancelled, tmp_path, json_output=False) == 143
    assert "Slurm job 1: CANCELLED before it started" in capsys.readouterr().err


def test_the_first_state_printed_is_never_pending_none(capsys: pytest.CaptureFixture[str]) -> None:
    from fstrain.cli.slurm import _say_state

    # Right after sbatch, before the scheduler looked at it (Slurm 22.05 on the test cluster).
    fresh = parse_scontrol_job("JobId=9 JobName=x JobState=PENDING Reason=None ExitCode=0:0 RunTime=00:00:00 "
                               "TimeLimit=00:10:00 NodeList=(null) NumNodes=2")
    assert (fresh.reason, fresh.nodes) == ("", "")
    _say_state(fresh)
    _say_state(JobStatus("9", "PENDING", 0, 0, "Priority"))
    assert capsys.readouterr().err.splitlines() == ["Slurm job 9: pending", "Slurm job 9: pending (Priority)"]


def test_a_tracker_that_does_not_answer_here_is_said_at_submission(tmp_path: Path) -> None:
    """`--slurm --mlflow URI`: the batch job's launch logs to the tracker and asks it first;
    the submission asks it too from this machine, and says so on stderr where it gets no answer
    (the job still goes: its first node may reach what this machine does not)."""
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    env = {**fake_sbatch(tmp_path / "bin"), "HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)}
    result = run_fstrain("launch", "--slurm", "--partition", "nope", "--mlflow", closed, "--run-dir",
                         str(tmp_path / "run"), "--", "true", env=env)
    warning, error = result.stderr.splitlines()
    assert warning.startswith(f"warning: --mlflow: the MLflow tracking server at {closed} does not answer: "), warning
    assert warning.endswith(", from this machine; the job is submitted all the same, and its launch asks again from "
                            "the job's first node, ending before the nodes start if it gets no answer there")
    assert error.startswith("error: sbatch: sbatch refused the job"), error  # submitted all the same
