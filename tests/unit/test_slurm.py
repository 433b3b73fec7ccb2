"""Slurm as values: the allocation from SLURM_*, srun step argv, the sbatch script, scontrol parsing."""

from __future__ import annotations

import io
import json
import os
import subprocess
from pathlib import Path

import pytest

from fstrain.core.slurm.job import (
    Allocation,
    JobStatus,
    SbatchOptions,
    allocation_from_env,
    cannot_start,
    check_hostnames,
    gpus_from_env,
    parse_hostnames,
    parse_partition_nodes,
    parse_sbatch_job_id,
    parse_scontrol_job,
    parse_step_ids,
    pyxis_args,
    render_sbatch,
    srun_step_argv,
)
from fstrain.errors import InputError, ParseError
from fstrain.io.slurm import follow

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "slurm"
SLURM_ENV = {**os.environ, "SLURM_JOB_ID": "77"}  # what sbatch gives the script


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("scontrol-job_*.json")), ids=lambda p: p.stem)
def test_scontrol_job_fixtures(path: Path) -> None:
    case = json.loads(path.read_text())
    status = parse_scontrol_job(case["output"])
    expected = case["expected"]
    assert (status.job_id, status.state, status.exit_code, status.signal, status.shell_exit_code) == (
        expected["job_id"], expected["state"], expected["exit_code"], expected["signal"], expected["shell_exit_code"])
    assert status.final


def test_scontrol_job_running_is_not_final_and_garbage_is_an_error() -> None:
    assert not parse_scontrol_job("JobId=3 JobName=x JobState=RUNNING Reason=None ExitCode=0:0").final
    with pytest.raises(ParseError, match="not a job description"):
        parse_scontrol_job("slurm_load_jobs error: Invalid job id specified")
    with pytest.raises(ParseError, match="unreadable ExitCode"):
        parse_scontrol_job("JobId=3 JobState=FAILED ExitCode=x:y")


def test_a_job_pending_for_the_partitions_configuration_never_starts() -> None:
    """A real 5-node job on the test Slurm's 3-node partition (Reason=PartitionConfig)."""
    case = json.loads((FIXTURES / "scontrol-pending_partitionconfig.json").read_text())
    status = parse_scontrol_job(case["output"])
    assert (status.state, status.reason, status.num_nodes, status.final) == ("PENDING", "PartitionConfig", 5, False)
    assert cannot_start(status) == ("PartitionConfig: the partition cannot hold what it asks for (more nodes, CPUs "
                                    "or memory than it has) (5 nodes asked)")
    # Its later looks say PartitionNodeLimit: never, for more nodes than the partition has; else
    # its nodes may only be DOWN or DRAINED for now.
    later_case = json.loads((FIXTURES / "scontrol-pending_partitionnodelimit.json").read_text())
    later = parse_scontrol_job(later_case["output"])
    size = parse_partition_nodes(json.loads((FIXTURES / "scontrol-partition.json").read_text())["output"])
    assert (later.reason, later.partition, size) == ("PartitionNodeLimit", "test", 3)
    assert cannot_start(later, size) == "PartitionNodeLimit: it asks for 5 nodes and partition test has 3"
    assert cannot_start(later, 8) is None and cannot_start(later, None) is None
    waiting = JobStatus("9", "PENDING", 0, 0, "Resources")  # it starts once nodes are free
    assert cannot_start(waiting) is None and cannot_start(JobStatus("9", "RUNNING", 0, 0, "PartitionConfig")) is None


def test_follow_gives_up_a_job_that_never_starts_and_not_one_that_waits(tmp_path: Path) -> None:
    first = JobStatus("9", "PENDING", 0, 0, "PartitionConfig", num_nodes=5, partition="test")
    stuck = JobStatus("9", "PENDING", 0, 0, "PartitionNodeLimit", num_nodes=5, partition="test")
    looks = iter([first, stuck, stuck, stuck])
    given_up = follow("9", tmp_path / "out", io.StringIO(), poll_s=0.01, status=lambda _: next(looks),
                      never_starts_after_s=0.01, partition_nodes=lambda name: 3)
    assert given_up == stuck  # returned still pending, for the caller to cancel and say why
    queued = iter([JobStatus("9", "PENDING", 0, 0, "Resources")] * 3 + [JobStatus("9", "COMPLETED", 0, 0)])
    ended = follow("9", tmp_path / "out", io.StringIO(), poll_s=0.01, status=lambda _: next(queued),
                   never_starts_after_s=0.0, partition_nodes=lambda name: 3)
    assert ended is not None and ended.state == "COMPLETED"


def test_allocation_from_env_expands_the_node_list_in_order() -> None:
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "gpu[07-08,10],login3"}
    assert allocation_from_env(env) == Allocation("42", ("gpu07", "gpu08", "gpu10", "login3"), None)
    assert allocation_from_env({"SLURM_JOB_NODELIST": "a"}) is None  # no job id: not an allocation
    assert allocation_from_env({}) is None


@pytest.mark.parametrize(("env", "gpus"), [
    ({"SLURM_GPUS_ON_NODE": "4", "SLURM_GPUS_PER_NODE": "8"}, 4),
    ({"SLURM_GPUS_PER_NODE": "h100:8"}, 8),
    ({"SLURM_GPUS_PER_NODE": "2"}, 2),
    ({"SLURM_TRES_PER_NODE": "cpu=4,gres/gpu:a100:4"}, 4),
    ({"SLURM_TRES_PER_NODE": "gres:gpu:2"}, 2),
    ({"SLURM_JOB_GPUS": "0,1,2"}, 3),
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, None),  # the login node's GPUs say nothing about the nodes'
    ({"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_STEP_ID": "0"}, 2),
    ({"SLURM_GPUS_ON_NODE": "0"}, None),
    ({}, None),
])
def test_gpus_per_node_from_env(env: dict[str, str], gpus: int | None) -> None:
    assert gpus_from_env(env) == gpus


def test_hostnames_cross_check() -> None:
    assert parse_hostnames("node1\nnode2\n\n") == ["node1", "node2"]
    assert check_hostnames(["n1", "n2"], ["n1", "n2"]) is None
    assert "scontrol" in str(check_hostnames(["n1", "n2"], ["n2", "n1"]))


def test_sbatch_job_id() -> None:
    assert parse_sbatch_job_id("1234\n") == "1234"
    assert parse_sbatch_job_id("1234;cluster-a\n") == "1234"
    with pytest.raises(ParseError, match="no job id"):
        parse_sbatch_job_id("sbatch: error: Batch job submission failed")


def test_srun_step_runs_one_task_on_one_node_with_stdin_and_overlap() -> None:
    extra = pyxis_args("nvcr.io#nvidia/pytorch:24.05", "/data:/data")
    argv = srun_step_argv("gpu07", srun="/usr/bin/srun", extra=extra)
    assert argv[0] == "/usr/bin/srun"
    for option in ("--nodes=1", "--ntasks=1", "--ntasks-per-node=1", "--nodelist=gpu07", "--kill-on-bad-exit=1",
                   "--overlap", "--input=all", "--container-image=nvcr.io#nvidia/pytorch:24.05",
                   "--container-mounts=/data:/data"):
        assert option in argv
    assert pyxis_args(None, None) == []
    with pytest.raises(InputError, match="--container-mounts needs --container-image"):
        pyxis_args(None, "/a:/b")


def options(**changes: object) -> SbatchOptions:
    base: dict[str, object] = {"nodes": 2, "job_name": "fstrain-r1", "output": "/runs/r1/slurm-%j.out"}
    base.update(changes)
    return SbatchOptions(**base)  # type: ignore[arg-type]


def render(opts: SbatchOptions, launch: list[str] | None = None) -> str:
    return render_sbatch(opts, launch_argv=launch or ["python3", "-m", "fstrain", "launch", "--launcher", "srun"],
                         workdir="/home/me/my project", run_id="r1", run_dir="/runs/r1",
                         step_prefix=srun_step_argv("NODE", extra=pyxis_args("img.sqsh", "/d:/d")))


def directives(script: str) -> list[str]:
    return [line.split("#", 2)[1].removeprefix("SBATCH ").split()[0] for line in script.splitlines()
            if line.startswith("#SBATCH")]


def test_sbatch_script_directives() -> None:
    script = render(options(gpus_per_node=8, partition="gpu", time="2:00:00", account="proj", qos="high",
                            constraint="h100", exclusive=True, no_kill=True, extra=("--mail-type=END",)))
    assert script.startswith("#!/bin/bash\n")
    assert directives(script) == [
        "--job-name=fstrain-r1", "--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=8", "--partition=gpu",
        "--time=2:00:00", "--account=proj", "--qos=high", "--constraint=h100", "--exclusive", "--no-kill",
        "--output=/runs/r1/slurm-%j.out", "--signal=B:USR1@90", "--mail-type=END"]
    minimal = directives(render(options()))
    assert minimal == ["--job-name=fstrain-r1", "--nodes=2", "--ntasks-per-node=1", "--output=/runs/r1/slurm-%j.out",
                       "--signal=B:USR1@90"]


def test_sbatch_script_body_quotes_and_shows_the_container_step() -> None:
    script = render_sbatch(options(), launch_argv=["python3", "-m", "fstrain", "launch"], workdir="/home/me/my project",
                           run_id="r1", run_dir="/runs/r 1", program=["python3", "train.py", "--name", "a b"],
                           step_prefix=srun_step_argv("NODE", extra=pyxis_args("img.sqsh", "/d:/d")))
    assert "cd '/home/me/my project'\n" in script
    assert "job_dir='/runs/r 1/job-'\"${SLURM_JOB_ID:?run this script with sbatch}\"\n" in script
    assert 'python3 -m fstrain launch --run-dir "$job_dir" -- python3 train.py --name \'a b\' &\n' in script
    assert "--container-image=img.sqsh --container-mounts=/d:/d" in script
    assert "trap on_time_limit USR1" in script
    assert script.rstrip().endswith('exit "$code"')


def test_sbatch_script_is_valid_bash_and_passes_the_exit_code(tmp_path: Path) -> None:
    """The script itself (with a stand-in for fstrain) runs under bash and exits with its code."""
    script = render_sbatch(options(), launch_argv=["sh", "-c", "exit 7", "sh"], workdir=str(tmp_path), run_id="r1",
                           run_dir=str(tmp_path), step_prefix=["srun"])
    path = tmp_path / "sbatch.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)], check=False).returncode == 0
    assert subprocess.run(["bash", str(path)], check=False, timeout=30, env=SLURM_ENV).returncode == 7
    assert (tmp_path / "job-77").is_dir()


def test_sbatch_script_turns_usr1_into_one_sigterm(tmp_path: Path) -> None:
    """USR1 (the time-limit warning) reaches the launcher as SIGTERM; the script waits for its exit."""
    program = ("import signal,sys,time\n"
               "signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))\n"
               "open(sys.argv[1], 'w').close()\n"
               "time.sleep(60)\n")
    ready = tmp_path / "ready"
    script = render_sbatch(options(), launch_argv=["python3", "-c", program, str(ready)], workdir=str(tmp_path),
                           run_id="r1", run_dir=str(tmp_path), step_prefix=["srun"])
    (tmp_path / "sbatch.sh").write_text(script)
    proc = subprocess.Popen(["bash", str(tmp_path / "sbatch.sh")], env=SLURM_ENV)
    try:
        for _ in range(200):
            if ready.exists():
                break
            subprocess.run(["sleep", "0.05"], check=True)
        proc.send_signal(10)  # SIGUSR1
        assert proc.wait(timeout=30) == 143
    finally:
        proc.kill()


@pytest.mark.parametrize(("changes", "message"), [
    ({"nodes": 0}, "--nodes must be 1 or more"),
    ({"gpus_per_node": 0}, "--gpus-per-node must be 1 or more"),
    ({"time": "two hours"}, "is not a Slurm time"),
    ({"partition": "gpu a"}, "--partition 'gpu a' must be one word"),
    ({"extra": ("mail-type=END",)}, "is not an sbatch option"),
])
def test_sbatch_bad_input(changes: dict[str, object], message: str) -> None:
    with pytest.raises(InputError, match=message):
        render(options(**changes))


@pytest.mark.parametrize("value", ["30", "2:00:00", "1-12", "1-12:30", "1-12:30:00", "10:00", "UNLIMITED"])
def test_sbatch_time_forms(value: str) -> None:
    assert "--time=" + value in render(options(time=value))


def test_plan_shape_fills_in_what_the_flags_leave_out() -> None:
    from fstrain.core.slurm.job import plan_shape

    allocation = Allocation("1", ("a", "b", "c"), 8)
    assert plan_shape(allocation, None, None) == (3, 8)
    assert plan_shape(allocation, 2, None) == (2, 8)
    assert plan_shape(Allocation("1", ("a",), None), None, 4) == (1, 4)


def test_step_ids_are_the_srun_steps_only() -> None:
    # `squeue -s -j 4 -h -o %i` on the test Slurm, two srun steps running in a batch job.
    assert parse_step_ids("4.0\n4.1\n4.batch\n", "4") == ["4.0", "4.1"]
    assert parse_step_ids("4.extern\n14.0\n", "4") == []
    assert parse_step_ids("", "4") == []
