"""The Slurm edge without a Slurm: following a job's output file, the report at its end, and
the node list cross-checked with a stand-in `scontrol`."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from fstrain.core.slurm.job import JobStatus
from fstrain.io.slurm import OutputFollower, follow
from tests.helpers import run_fstrain


def test_follower_prints_whole_lines_only_until_the_end(tmp_path: Path) -> None:
    path = tmp_path / "slurm-1.out"
    out = io.StringIO()
    follower = OutputFollower(path, out)
    follower.poll()  # no file yet: nothing, no error
    path.write_bytes(b"[node1] one\n[node1] tw")
    follower.poll()
    assert out.getvalue() == "[node1] one\n"
    with path.open("ab") as handle:
        handle.write(b"o\n[node2] last, no newline")
    follower.poll()
    assert out.getvalue() == "[node1] one\n[node1] two\n"
    follower.poll(final=True)
    assert out.getvalue().endswith("[node2] last, no newline\n")


def test_follow_polls_until_a_final_state(tmp_path: Path) -> None:
    path = tmp_path / "slurm-9.out"
    states = iter(["PENDING", "RUNNING", "RUNNING", "FAILED"])

    def status(job_id: str) -> JobStatus:
        state = next(states)
        if state == "RUNNING":
            with path.open("a") as handle:
                handle.write(f"line while {state}\n")
        return JobStatus(job_id, state, 7 if state == "FAILED" else 0, 0)

    out = io.StringIO()
    changes: list[str] = []
    final = follow("9", path, out, poll_s=0, status=status, on_state=lambda s: changes.append(s.state))
    assert final is not None and (final.state, final.shell_exit_code) == ("FAILED", 7)
    assert out.getvalue() == "line while RUNNING\nline while RUNNING\n"
    assert changes == ["PENDING", "RUNNING"]  # each change once


def fake_scontrol(folder: Path, answer: str) -> dict[str, str]:
    folder.mkdir()
    script = folder / "scontrol"
    script.write_text(f"#!/bin/sh\n[ \"$1 $2\" = 'show hostnames' ] || exit 3\nprintf '{answer}'\n")
    script.chmod(0o755)
    return {"PATH": f"{folder}:{os.environ['PATH']}", "SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "n[1-2]"}


@pytest.mark.parametrize(("answer", "order", "warned"), [
    ("n1\\nn2\\n", ["n1", "n2"], False),
    ("n2\\nn1\\n", ["n2", "n1"], True),  # Slurm's own expansion wins, and fstrain says so
])
def test_node_order_is_cross_checked_with_scontrol(tmp_path: Path, answer: str, order: list[str],
                                                   warned: bool) -> None:
    env = fake_scontrol(tmp_path / "bin", answer)
    result = run_fstrain("launch", "--dry-run", "--json", "--nproc-per-node", "1", "--", "true", env=env)
    assert result.returncode == 0, result.stderr
    assert [n["host"] for n in json.loads(result.stdout)["nodes"]] == order
    assert ("warning: SLURM_JOB_NODELIST expands to n1, n2 here but to n2, n1" in result.stderr) is warned


def test_job_report_takes_the_jobs_code_and_joins_the_manifest(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from fstrain.cli.slurm import report_job
    from fstrain.core.runs.manifest import Manifest

    job_dir = tmp_path / "job-12"  # the job's own records (the script may have run as other jobs too)
    job_dir.mkdir()
    written = Manifest("r1", "torchrun", exit_code=7, reason="failed").to_dict("0.1.0")
    (job_dir / "manifest.json").write_text(json.dumps(written))
    (job_dir / "summary.json").write_text(json.dumps({"world_size": 4}))
    other = Manifest("r1", "torchrun", exit_code=3, reason="failed").to_dict("0.1.0")
    (tmp_path / "manifest.json").write_text(json.dumps(other))  # not job 12's
    assert report_job("12", JobStatus("12", "FAILED", 7, 0, nodes="node1"), tmp_path, json_output=True) == 7
    document = json.loads(capsys.readouterr().out)
    assert document == {"job_id": "12", "state": "FAILED", "exit_code": 7, "reason": "", "run_dir": str(tmp_path),
                        "job_dir": str(job_dir), "manifest": written,
                        "training_summary": {"world_size": 4}}
    # Slurm has forgotten the job: the manifest's code is the answer.
    assert report_job("12", None, tmp_path, json_output=False) == 7
    assert report_job("12", JobStatus("12", "CANCELLED", 0, 15), tmp_path / "none", json_output=False) == 143


def test_no_sbatch_is_one_line_and_the_script_stays(tmp_path: Path) -> None:
    """On a machine without Slurm: the script is written (to submit elsewhere), the error says why."""
    import sys

    env = {"PATH": str(Path(sys.executable).parent), "SLURM_JOB_ID": "", "SLURM_JOB_NODELIST": ""}
    result = run_fstrain("launch", "--slurm", "--run-dir", str(tmp_path / "run"), "--", "true", env=env)
    assert result.returncode == 2
    assert result.stderr.strip() == ("error: --slurm: sbatch not found on PATH (hint: run this on "
                                                      "a Slurm login or compute node, or load the Slurm module)")
    assert (tmp_path / "run" / "sbatch.sh").is_file()
