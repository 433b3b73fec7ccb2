"""`fstrain runs/status/logs/stop/gc` on a run submitted with `launch --slurm`, with stand-ins for
scontrol and scancel that answer as the test Slurm did (tests/fixtures/slurm-runs), own HOME."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from fstrain.core.hosts.hostfile import Host
from fstrain.core.job.spec import NodeLaunch
from fstrain.io.launch import RunOutcome, RunSetup, manifest_of, write_manifest
from tests.helpers import REPO, run_fstrain

FIXTURES = REPO / "tests" / "fixtures" / "slurm-runs"
RUN_ID = "20261130-120000-aaaaaa"


def slurm_tools(folder: Path, fixture: str | None, *, scancel: bool = True) -> dict[str, str]:
    """scontrol answering job 42 with the fixture's output (or "Invalid job id" if None); a
    scancel that records its arguments in folder/scancel.log."""
    folder.mkdir(exist_ok=True)
    if fixture is None:
        body = "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1"
    else:
        output = json.loads((FIXTURES / f"{fixture}.json").read_text())["output"]
        (folder / "job.txt").write_text(output.replace("JobId=", "JobId=42 Was=", 1))
        body = f"[ \"$*\" = 'show job -o 42' ] || exit 3\n/bin/cat {folder}/job.txt"
    (folder / "scontrol").write_text(f"#!/bin/sh\n{body}\n")
    (folder / "scontrol").chmod(0o755)
    (folder / "squeue").write_text("#!/bin/sh\n[ \"$*\" = '-s -j 42 -h -o %i' ] || exit 3\n"
                                   "printf '42.0\\n42.1\\n42.batch\\n'\n")
    (folder / "squeue").chmod(0o755)
    if scancel:
        (folder / "scancel").write_text(f"#!/bin/sh\necho \"$*\" >> {folder}/scancel.log\n")
        (folder / "scancel").chmod(0o755)
    return {"PATH": str(folder)}  # only the stand-ins: never a real Slurm client


def slurm_run(home: Path, folder: Path) -> None:
    """A run as `launch --slurm` leaves it, with the job's own launch registered too (a shared
    home), and the logs that launch writes in the job's folder (job-42)."""
    logs = folder / "job-42" / "logs"
    logs.mkdir(parents=True)
    (folder / "slurm-42.out").write_text("[node1 r0] hello\n[node2 r1] world\n")
    (logs / "node1.log").write_text("[node1 r0] hello\n")
    (logs / "node1.r0.log").write_text("[node1 r0] step 3/10 loss 2.5000 tokens/s 1,000\n")
    (logs / "node2.r1.log").write_text("[node2 r1] world\n")
    # The submission's records (slurm.json, the index entry), then the job's own `fstrain launch`
    # (another run id, the job's folder) registering itself, as `launch --slurm` and that launch do.
    subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                    "from fstrain.io.runs import record_slurm, register; folder = Path(sys.argv[1]); "
                    "record_slurm(folder, run_id=sys.argv[2], job_id='42', script=folder / 'sbatch.sh', "
                    "output=folder / 'slurm-42.out', grace_s=1.0); "
                    "register('20261130-120001-bbbbbb', folder / 'job-42', detached=False)", str(folder), RUN_ID],
                   env={**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO)}, check=True, timeout=60)


def test_a_slurm_run_is_listed_once_with_slurms_state(tmp_path: Path) -> None:
    home = tmp_path / "home"
    slurm_run(home, tmp_path / "run")
    assert [p.name for p in (home / ".fstrain" / "launched").iterdir()] == [f"{RUN_ID}.json"]
    # Even an entry written before the folder was claimed is not listed twice.
    (home / ".fstrain" / "launched" / "other.json").write_text(json.dumps(
        {"run_id": "other", "run_dir": str(tmp_path / "run"), "detached": False, "client_pid": 0}))
    env = {"HOME": str(home), **slurm_tools(tmp_path / "bin", "running")}
    rows = json.loads(run_fstrain("runs", "--json", env=env).stdout)["runs"]
    assert [(r["run_id"], r["state"], r["job_id"], r["nodes"], r["seconds"]) for r in rows] == [
        (RUN_ID, "running", "42", ["node1", "node2"], 3)]
    status = json.loads(run_fstrain("status", "42", "--json", env=env).stdout)  # by its job id
    assert (status["run_id"], status["state"], status["job"]["state"]) == (RUN_ID, "running", "RUNNING")
    ranks = [(n["host"], r["rank"], r["progress"]["step"] if r["progress"] else None)
             for n in status["nodes"] for r in n["ranks"]]
    assert ranks == [("node1", 0, 3), ("node2", 1, None)]


def test_logs_of_a_slurm_run(tmp_path: Path) -> None:
    home = tmp_path / "home"
    slurm_run(home, tmp_path / "run")
    env = {"HOME": str(home), **slurm_tools(tmp_path / "bin", "completed")}
    assert run_fstrain("logs", RUN_ID, env=env).stdout == "[node1 r0] hello\n[node2 r1] world\n"
    assert run_fstrain("logs", RUN_ID, "--tail", "1", env=env).stdout == "[node2 r1] world\n"
    assert run_fstrain("logs", RUN_ID, "--tail", "0", env=env).stdout == ""
    assert run_fstrain("logs", RUN_ID, "--rank", "1", env=env).stdout == "[node2 r1] world\n"
    assert run_fstrain("logs", RUN_ID, "--host", "node1", env=env).stdout == "[node1 r0] hello\n"
    # --follow of an ended job prints what there is and returns.
    assert run_fstrain("logs", RUN_ID, "--follow", env=env, timeout=30).stdout.count("\n") == 2
    bad = run_fstrain("logs", RUN_ID, "--host", "node7", env=env)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --host: 'node7' is not one of the run's hosts")
    since = run_fstrain("logs", RUN_ID, "--since", "5m", env=env)
    assert since.returncode == 2 and "hint: use --tail N" in since.stderr


def test_stop_signals_every_process_of_the_job(tmp_path: Path) -> None:
    home = tmp_path / "home"
    slurm_run(home, tmp_path / "run")
    env = {"HOME": str(home), **slurm_tools(tmp_path / "bin", "running")}
    # The stand-in job never ends: TERM to all of it, after --grace SIGKILL to each srun step
    # and Slurm's cancellation, then the wait gives up.
    stop = run_fstrain("stop", RUN_ID, "--grace", "1", "--wait", "2", env=env, timeout=60)
    assert stop.returncode == 2 and "has not ended" in stop.stderr and stop.stderr.count("\n") == 1
    assert (tmp_path / "bin" / "scancel.log").read_text().splitlines() == [
        "--signal=TERM --full 42", "--signal=KILL 42.0", "--signal=KILL 42.1", "42"]
    # Slurm then reports the end the script gave (143): `fstrain stop` made it `stopped`.
    slurm_tools(tmp_path / "bin", "stopped-term-full")
    rows = json.loads(run_fstrain("runs", "--all", "--json", env=env).stdout)["runs"]
    assert [(r["state"], r["exit_code"], r["reason"]) for r in rows] == [("stopped", 143, "fstrain stop")]
    again = run_fstrain("stop", RUN_ID, env=env)
    assert again.returncode == 0 and "has already ended: stopped, exit 143" in again.stderr
    gc = run_fstrain("gc", "--older-than", "1s", env=env)
    assert gc.returncode == 0 and "Slurm job 42: forgotten here" in gc.stderr
    assert json.loads(run_fstrain("runs", "--all", "--json", env=env).stdout) == {"runs": []}
    assert (tmp_path / "run" / "slurm-42.out").is_file()  # the run directory stays


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    slurm_run(home, tmp_path / "run")
    unknown = run_fstrain("stop", "nope", env={"HOME": str(home)})
    assert unknown.returncode == 2 and unknown.stderr.startswith("error: RUN: no run 'nope' was started")
    # No scancel on this machine.
    env = {"HOME": str(home), **slurm_tools(tmp_path / "bin", "running", scancel=False)}
    missing = run_fstrain("stop", RUN_ID, "--force", env=env)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert missing.stderr.startswith("error: stop: scancel not found on PATH (hint:")
    # Slurm does not know the job, and the run directory has no manifest: lost, and stop says why.
    env = {"HOME": str(home), **slurm_tools(tmp_path / "bin2", None)}
    rows = json.loads(run_fstrain("runs", "--all", "--json", env=env).stdout)["runs"]
    assert [(r["state"], r["slurm_state"]) for r in rows] == [("lost", "UNKNOWN")]
    stop = run_fstrain("stop", RUN_ID, env=env)
    assert stop.returncode == 2 and stop.stderr.count("\n") == 1
    assert stop.stderr.startswith("error: stop: Slurm does not know job 42") and "(hint: is SLURM_CONF" in stop.stderr
    # Once the manifest recorded the end, the forgotten job is simply over.
    launches = [NodeLaunch(Host(f"node{i + 1}"), i, 1, ("python3", "t.py")) for i in range(2)]
    write_manifest(tmp_path / "run" / "job-42" / "manifest.json", manifest_of(
        RunSetup("20261130-120001-bbbbbb", "torchrun", launches), RunOutcome(0, "ok", None, [], 1.0, 2.0)))
    (tmp_path / "run" / "job-42" / "state.json").unlink()
    rows = json.loads(run_fstrain("runs", "--all", "--json", env=env).stdout)["runs"]
    assert [(r["state"], r["exit_code"], r["nodes"]) for r in rows] == [("succeeded", 0, ["node1", "node2"])]


def test_a_stop_marked_after_another_process_saw_the_end_still_counts(tmp_path: Path) -> None:
    home = tmp_path / "home"
    run_dir = tmp_path / "run"
    slurm_run(home, run_dir)
    env = {"HOME": str(home), **slurm_tools(tmp_path / "bin", "stopped-term-full")}
    rows = json.loads(run_fstrain("runs", "--all", "--json", env=env).stdout)["runs"]
    assert [(r["state"], r["exit_code"]) for r in rows] == [("failed", 143)]  # no stop asked: Slurm's FAILED
    record = json.loads((run_dir / "slurm.json").read_text())
    (run_dir / "slurm.json").write_text(json.dumps({**record, "stop_requested": time.time()}))
    status = json.loads(run_fstrain("status", str(run_dir), "--json", env=env).stdout)  # by its directory
    assert (status["run_id"], status["state"], status["exit_code"]) == (RUN_ID, "stopped", 143)
