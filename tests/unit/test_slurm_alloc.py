"""Launches inside a Slurm allocation, without a Slurm: one launch per allocation (never one per
srun task), the job's node list rather than a step's, and a node list Slurm cannot read. A
stand-in `scontrol` answers as the real one does (its answers below were captured on the test
Slurm of scripts/testslurm.sh)."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fstrain.core.slurm.job import (
    MAX_LISTED_NODES,
    check_hostnames,
    check_hosts_in_job,
    check_one_task,
    job_nodes_note,
    list_nodes,
    rejected_nodelist,
)
from fstrain.errors import InputError, InventoryError
from tests.helpers import run_fstrain

# `scontrol show job -o 14` of a running 2-node salloc job (trimmed to the fields read).
JOB_LINE = ("JobId=14 JobName=interactive UserId=root(0) JobState=RUNNING Reason=None Dependency=(null) "
            "RunTime=00:00:09 NodeList=node[1-2] NumNodes=2 ExitCode=0:0")


# -- one launch per allocation ------------------------------------------------------------------

@pytest.mark.parametrize(("environ", "refused"), [
    ({"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2"}, True),  # srun in salloc -N2
    ({"SLURM_STEP_ID": "0", "SLURM_NTASKS": "8"}, True),  # an older Slurm: no SLURM_STEP_NUM_TASKS
    ({"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1"}, False),  # srun -N1 -n1
    ({"SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "1"}, False),  # a batch script: not a step
    ({}, False),
])
def test_a_step_of_several_tasks_is_refused(environ: dict[str, str], refused: bool) -> None:
    if refused:
        with pytest.raises(InputError, match="each would start a whole launch of its own") as caught:
            check_one_task(environ)
        assert "srun -N1 -n1 --overlap" in caught.value.hint
    else:
        check_one_task(environ)


def test_launch_in_a_step_of_two_tasks_is_one_line_and_starts_nothing(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "14", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_STEP_ID": "0",
           "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2", "HOME": str(tmp_path)}
    run_dir = tmp_path / "run"
    result = run_fstrain("launch", "--run-dir", str(run_dir), "--", "true", env=env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: srun: this srun step runs 2 tasks"), result.stderr
    assert not run_dir.exists() and not (tmp_path / ".fstrain").exists()  # no run id taken, nothing recorded


# -- the job's node list ------------------------------------------------------------------------

def test_a_step_that_holds_fewer_nodes_than_its_job_is_said_in_one_line() -> None:
    assert job_nodes_note("14", ["node1", "node2"], ["node1", "node2"]) is None
    assert job_nodes_note("14", ["node1"], ["node1", "node2"]) == (
        "this srun step holds 1 of Slurm job 14's 2 nodes (node1); fstrain runs on all of the job's: node1, node2")
    note = job_nodes_note("14", ["x9"], ["node1", "node2"])
    assert note is not None and note.startswith("SLURM_JOB_NODELIST names x9, but Slurm job 14 holds node1, node2")


def test_hosts_outside_the_job_are_named_with_the_jobs_nodes() -> None:
    check_hosts_in_job(["node2", "node1"], "14", ["node1", "node2"], "--hosts")  # the job's: fine
    with pytest.raises(InventoryError) as raised:
        check_hosts_in_job(["node1", "node3", "node3"], "14", ["node1", "node2"], "--hosts")
    assert raised.value.one_line() == (
        "--hosts: node3 is not in Slurm job 14, whose nodes are node1, node2: srun reaches only those "
        "(hint: name the job's nodes, or reach other hosts over SSH with --launcher ssh)")
    with pytest.raises(InventoryError, match=r"^--hostfile: node3, node4 are not in Slurm job 14"):
        check_hosts_in_job(["node3", "node4"], "14", ["node1", "node2"], "--hostfile")


def test_listings_in_messages_are_capped() -> None:
    many = [f"n{i}" for i in range(70000)]
    assert list_nodes(many) == ", ".join(many[:MAX_LISTED_NODES]) + f" and {70000 - MAX_LISTED_NODES:,} more"
    problem = check_hostnames(many, many[::-1])
    assert problem is not None and len(problem) < 300


def fake_scontrol(folder: Path, hostnames: dict[str, str], job_line: str = JOB_LINE,
                  rejected: str = "") -> dict[str, str]:
    """An `scontrol` on PATH: `show hostnames LIST` prints hostnames[LIST] (one per line), or for
    any other list what the real one does with a list it cannot read (the message on stderr,
    nothing on stdout, exit status 0); `show job -o ID` prints ``job_line``."""
    folder.mkdir()
    script = folder / "scontrol"
    script.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import sys
        answers = {hostnames!r}
        args = sys.argv[1:]
        if args[:2] == ["show", "hostnames"]:
            if args[2] in answers:
                print("\\n".join(answers[args[2]].split(",")))
            else:
                sys.stderr.write({rejected!r} or f"Invalid hostlist: {{args[2]}}\\n")
        elif args[:3] == ["show", "job", "-o"]:
            print({job_line!r})
        else:
            sys.exit(3)
        """))
    script.chmod(0o755)
    return {"PATH": f"{folder}:{os.environ['PATH']}", "SLURM_JOB_ID": "14"}


def test_inside_a_step_of_one_node_the_launch_takes_the_jobs_nodes(tmp_path: Path) -> None:
    """`srun --jobid=14 -N1 fstrain launch`: SLURM_JOB_NODELIST is the step's (node1); the job
    holds node[1-2], and the launch runs on both, saying so."""
    env = fake_scontrol(tmp_path / "bin", {"node1": "node1", "node[1-2]": "node1,node2"})
    env.update(SLURM_JOB_NODELIST="node1", SLURM_STEP_ID="0", SLURM_STEP_NUM_TASKS="1", SLURM_NTASKS="1")
    result = run_fstrain("launch", "--dry-run", "--json", "--nproc-per-node", "1", "--", "true", env=env)
    assert result.returncode == 0, result.stderr
    assert [n["host"] for n in json.loads(result.stdout)["nodes"]] == ["node1", "node2"]
    assert result.stderr.count("warning: this srun step holds 1 of Slurm job 14's 2 nodes (node1)") == 1


def test_where_the_job_has_no_answer_the_variable_is_used(tmp_path: Path) -> None:
    env = fake_scontrol(tmp_path / "bin", {"node[1-2]": "node1,node2"}, job_line="")
    env.update(SLURM_JOB_NODELIST="node[1-2]")
    result = run_fstrain("launch", "--dry-run", "--json", "--nproc-per-node", "1", "--", "true", env=env)
    assert result.returncode == 0, result.stderr
    assert [n["host"] for n in json.loads(result.stdout)["nodes"]] == ["node1", "node2"]
    assert "warning" not in result.stderr


# -- a node list Slurm cannot read --------------------------------------------------------------

REJECTED = "scontrol: error: _parse_single_range: Too many hosts in range `1-70000'\nInvalid hostlist: node[1-70000]\n"


def test_a_rejected_node_list_is_one_error_naming_the_variable() -> None:
    error = rejected_nodelist("SLURM_JOB_NODELIST", "node[1-70000]" + ",x" * 500, REJECTED)
    assert error.message.startswith("Slurm cannot read SLURM_JOB_NODELIST='node[1-70000],x,x")
    assert error.message.endswith("...': _parse_single_range: Too many hosts in range `1-70000'")
    assert len(error.message) < 250 and error.where == "SLURM_JOB_NODELIST"


@pytest.mark.parametrize("command", [["launch", "--dry-run", "--nproc-per-node", "1", "--", "true"],
                                     ["doctor"], ["exec", "--", "true"]])
def test_commands_end_at_once_on_a_rejected_node_list(tmp_path: Path, command: list[str]) -> None:
    """scontrol rejects the list but exits 0: one line, exit 2, never "--hosts is empty" nor a
    listing of the 70,000 names fstrain's own expansion gives."""
    env = fake_scontrol(tmp_path / "bin", {}, rejected=REJECTED)
    env.update(SLURM_JOB_NODELIST="node[1-70000]")
    started = time.monotonic()
    result = run_fstrain(*command, env=env, timeout=60)
    assert time.monotonic() - started < 30
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and len(lines[0]) < 500, result.stderr[-2000:]
    assert lines[0].startswith("error: SLURM_JOB_NODELIST: Slurm cannot read SLURM_JOB_NODELIST='node[1-70000]'")
    assert "--hosts is empty" not in result.stderr
