"""`fstrain.api.submit` without a command line: the batch job's own `fstrain launch` gets the
options the request carries, exactly as the CLI passes the ones typed."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from fstrain.api.requests import HostRequest, JobRequest, LaunchRequest, RunSettings, SlurmRequest, TrackerRequest
from fstrain.api.slurm import SubmitRequest, launch_args_of, submit
from tests.helpers import REPO, run_fstrain

NO_SLURM = {"SLURM_JOB_ID": "", "SLURM_JOB_NODELIST": "", "SLURM_NODELIST": ""}


def launch_options(script: str, folder: Path) -> list[str]:
    """The batch job's `fstrain launch` options, its own run directory's path made neutral."""
    line = next(line for line in script.splitlines() if " -m fstrain launch " in line)
    words = shlex.split(line.replace(str(folder), "FOLDER").rstrip(" &"))
    return [number(word) for word in words[words.index("launch") + 1:words.index("--") if "--" in words else None]]


def number(word: str) -> str:
    """``40.0`` (typer's float) and ``40`` (the request's) are one value."""
    try:
        return f"{float(word):g}"
    except ValueError:
        return word


@pytest.mark.parametrize(("flags", "request_"), [
    ((), LaunchRequest()),
    (("--nproc-per-node", "2", "--backend", "deepspeed", "--grace", "40", "--stall-timeout", "90s",
      "--on-failure", "restart", "--max-restarts", "2", "--steps", "5", "--model", "tiny", "--no-local-rank",
      "--container-image", "nvcr.io/x", "--no-default-mounts", "--exclude", "node3"),
     LaunchRequest(hosts=HostRequest(exclude="node3"),
                   job=JobRequest(nproc_per_node=2, backend="deepspeed", steps=5, model="tiny", no_local_rank=True),
                   run=RunSettings(grace_s=40.0, stall_timeout_s=90.0, on_failure="restart", max_restarts=2),
                   container_image="nvcr.io/x", container_default_mounts=False)),
])
def test_a_requests_options_reach_the_batch_jobs_launch_as_the_command_lines_do(
        flags: tuple[str, ...], request_: LaunchRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    typed = run_fstrain("render", "--slurm", "-o", str(tmp_path / "cli"), *flags, "--", "true", env=NO_SLURM)
    assert typed.returncode == 0, typed.stderr
    monkeypatch.chdir(REPO)  # the script names the working directory: the same one
    for name, value in NO_SLURM.items():
        monkeypatch.setenv(name, value)
    job = JobRequest(**{**request_.job.__dict__, "program": ("true",)})
    run = RunSettings(**{**request_.run.__dict__, "run_dir": str(tmp_path / "api")})
    made = submit(SubmitRequest(LaunchRequest(request_.hosts, job, run, request_.container_image,
                                              request_.container_mounts, request_.container_default_mounts),
                                SlurmRequest(), render_only=True))
    assert made.job_id is None and made.script == (tmp_path / "api" / "sbatch.sh").resolve()
    from_cli = launch_options((tmp_path / "cli" / "sbatch.sh").read_text(), (tmp_path / "cli").resolve())
    from_api = launch_options(made.script.read_text(), (tmp_path / "api").resolve())
    assert sorted(from_api) == sorted(from_cli), (from_api, from_cli)
    assert from_api[:2] == ["--launcher", "srun"]


def test_defaults_give_no_option() -> None:
    assert launch_args_of(LaunchRequest()) == []
    assert launch_args_of(LaunchRequest(run=RunSettings(finish_timeout_s=1.5))) == ["--finish-timeout", "1.5s"]


def test_the_batch_jobs_launch_logs_to_the_same_trackers() -> None:
    trackers = TrackerRequest(mlflow="http://mlflow:5000", mlflow_experiment="llm", wandb="proj", wandb_offline=True)
    assert launch_args_of(LaunchRequest(trackers=trackers)) == [
        "--mlflow", "http://mlflow:5000", "--mlflow-experiment", "llm", "--wandb", "proj", "--wandb-offline"]
