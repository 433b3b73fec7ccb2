"""`fstrain launch` and `render` with Slurm options, where no Slurm daemon is needed: bad input,
the rendered batch script, and the per-node commands inside an allocation (--dry-run)."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from tests.helpers import run_fstrain

NO_SLURM = {"SLURM_JOB_ID": "", "SLURM_JOB_NODELIST": "", "SLURM_JOBID": "", "SLURM_NODELIST": ""}


def one_error_line(result: object, fragment: str) -> None:
    stderr = result.stderr  # type: ignore[attr-defined]
    assert result.returncode == 2, stderr  # type: ignore[attr-defined]
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], stderr
    assert "Traceback" not in stderr


@pytest.mark.parametrize(("args", "fragment"), [
    (["--slurm", "--hosts", "a,b", "--model", "tiny"], "--hosts cannot be combined with --slurm"),
    (["--slurm", "--launcher", "ssh", "--model", "tiny"], "--launcher ssh cannot be combined with --slurm"),
    (["--slurm", "--dry-run", "--model", "tiny"], "fstrain render --slurm"),
    (["--slurm", "--time", "two hours", "--model", "tiny"], "--time: --time 'two hours' is not a Slurm time"),
    (["--slurm", "--sbatch-arg", "mail", "--model", "tiny"], "is not an sbatch option"),
    (["--slurm", "--container-mounts", "/a:/b", "--model", "tiny"], "--container-mounts needs --container-image"),
    (["--nodes", "2", "--", "true"], "--nodes: --nodes is an sbatch option (hint: add --slurm"),
    (["--partition", "gpu", "--", "true"], "--partition is an sbatch option"),
    (["--launcher", "srun", "--", "true"], "--launcher srun runs inside a Slurm allocation"),
    (["--launcher", "pdsh", "--", "true"], "unknown launcher 'pdsh'"),
    (["--hosts", "localhost", "--container-image", "img", "--", "true"], "runs the nodes' steps in a Pyxis container"),
])
def test_bad_slurm_input_is_one_line(args: list[str], fragment: str, tmp_path: Path) -> None:
    result = run_fstrain("launch", "--run-dir", str(tmp_path / "run"), *args, env=NO_SLURM)
    one_error_line(result, fragment)
    assert not (tmp_path / "run").exists()  # nothing written, nothing submitted


def test_render_slurm_writes_the_script_and_keeps_secrets_off_it(tmp_path: Path) -> None:
    out = tmp_path / "job"
    result = run_fstrain("render", "--slurm", "-o", str(out), "--nodes", "2", "--gpus-per-node", "4",
                         "--partition", "gpu", "--time", "1:00:00", "--exclusive", "--sbatch-arg=--mail-type=END",
                         "--container-image", "nvcr.io#nvidia/pytorch:24.05", "--nproc-per-node", "4",
                         "--backend", "deepspeed", "--model", "tiny", "--steps", "5", "--grace", "7",
                         "--env", "HF_TOKEN=hf_supersecret", "--json", env=NO_SLURM)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    script = Path(document["script"]).read_text()
    assert Path(document["script"]) == out / "sbatch.sh"
    for line in ("#SBATCH --nodes=2", "#SBATCH --gpus-per-node=4", "#SBATCH --partition=gpu", "#SBATCH --time=1:00:00",
                 "#SBATCH --exclusive", "#SBATCH --mail-type=END", f"#SBATCH --output={out}/slurm-%j.out"):
        assert line in script
    command = next(line for line in script.splitlines() if " -m fstrain launch " in line)
    assert f"job_dir={out}/job-\"${{SLURM_JOB_ID:?run this script with sbatch}}\"\n" in script
    for part in ("--launcher srun", '--run-dir "$job_dir"', f"--env-file {out}/launch.env", "--nproc-per-node 4",
                 "--backend deepspeed", "--model tiny", "--steps 5", "--grace 7.0",
                 "--container-image 'nvcr.io#nvidia/pytorch:24.05'"):
        assert part in command, command
    assert "--slurm" not in command and "--nodes" not in command and "--partition" not in command
    assert "hf_supersecret" not in script and "hf_supersecret" not in result.stdout + result.stderr
    env_file = out / "launch.env"
    assert env_file.read_text() == "HF_TOKEN=hf_supersecret\n"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600


def test_render_slurm_keeps_the_program_after_double_dash(tmp_path: Path) -> None:
    result = run_fstrain("render", "--slurm", "-o", str(tmp_path / "job"), "--", "python3", "train.py", "--lr",
                         "3e-4", "--name", "two words", env=NO_SLURM)
    assert result.returncode == 0, result.stderr
    script = (tmp_path / "job" / "sbatch.sh").read_text()
    assert "-- python3 train.py --lr 3e-4 --name 'two words' &" in script
    assert not (tmp_path / "job" / "launch.env").exists()


def allocation_env(**more: str) -> dict[str, str]:
    return {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "gpu[07-08]", **more}


def test_dry_run_inside_an_allocation_uses_its_nodes_and_gpus() -> None:
    result = run_fstrain("launch", "--dry-run", "--json", "--", "python3", "train.py",
                         env=allocation_env(SLURM_GPUS_PER_NODE="h100:2"))
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert [n["host"] for n in document["nodes"]] == ["gpu07", "gpu08"]
    assert [n["nproc"] for n in document["nodes"]] == [2, 2]
    assert document["master_addr"] == "gpu07"
    assert "--nnodes=2" in document["nodes"][1]["argv"] and "--node-rank=1" in document["nodes"][1]["argv"]


def test_detach_inside_an_allocation_is_refused() -> None:
    one_error_line(run_fstrain("launch", "--detach", "--", "true", env=allocation_env()),
                   "--detach cannot outlive the terminal inside a Slurm allocation")


def test_hosts_given_inside_an_allocation_mean_ssh_unless_srun_is_asked(tmp_path: Path) -> None:
    result = run_fstrain("launch", "--dry-run", "--json", "--hosts", "other[1-3]", "--nproc-per-node", "1", "--",
                         "python3", "train.py", env=allocation_env())
    assert result.returncode == 0, result.stderr
    assert [n["host"] for n in json.loads(result.stdout)["nodes"]] == ["other1", "other2", "other3"]


def test_plan_inside_an_allocation_takes_its_nodes_and_gpus() -> None:
    result = run_fstrain("plan", "--model", "llama3.1-8b", "--gpu", "h100-sxm", "--json",
                         env=allocation_env(SLURM_GPUS_PER_NODE="4"))
    assert result.returncode == 0, result.stderr
    cluster = json.loads(result.stdout)["cluster"]
    assert (cluster["num_nodes"], cluster["gpus_per_node"], cluster["world_size"]) == (2, 4, 8)
    assert "cluster: Slurm job 77, 2 nodes x 4 GPUs" in result.stderr
    pinned = run_fstrain("plan", "--model", "llama3.1-8b", "--gpu", "h100-sxm", "--num-nodes", "1", "--json",
                         env=allocation_env(SLURM_GPUS_PER_NODE="4"))
    assert json.loads(pinned.stdout)["cluster"]["num_nodes"] == 1  # the flags win


def test_render_inside_an_allocation_plans_for_it(tmp_path: Path) -> None:
    result = run_fstrain("render", "-o", str(tmp_path / "out"), "--model", "tiny", "--gpu", "h100-sxm",
                         env=allocation_env(SLURM_GPUS_PER_NODE="2"))
    assert result.returncode == 0, result.stderr
    plan = (tmp_path / "out" / "plan.yaml").read_text()
    assert "num_nodes: 2" in plan and "gpus_per_node: 2" in plan


def test_render_slurm_reads_its_own_arguments_not_the_processes(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Called in-process (a notebook, a test), the program comes from the arguments given."""
    from fstrain.cli.main import app

    for name, value in NO_SLURM.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "argv", ["jupyter", "--", "not", "this"])
    code = app(["render", "--slurm", "-o", str(tmp_path / "job"), "--nodes", "2", "--", "python3", "x.py", "-v"],
               prog_name="fstrain", standalone_mode=False)
    assert code in (0, None)
    script = (tmp_path / "job" / "sbatch.sh").read_text()
    assert "-- python3 x.py -v &" in script and "not this" not in script
