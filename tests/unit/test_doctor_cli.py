"""`fstrain doctor` as a user runs it, on this machine (checks that need no probe: fast)."""

from __future__ import annotations

import json
from pathlib import Path

from fstrain.cli.doctor import table_rows
from fstrain.core.doctor import IDS
from fstrain.core.doctor.result import CheckResult
from tests.helpers import run_fstrain


def test_list_names_every_check_without_connecting() -> None:
    result = run_fstrain("doctor", "--list", "--hosts", "no-such-host.invalid")
    assert result.returncode == 0
    assert [line.split()[0] for line in result.stdout.splitlines()] == list(IDS)


def test_unknown_check_is_one_line_with_a_suggestion() -> None:
    result = run_fstrain("doctor", "--only", "gpu.ec")
    assert result.returncode == 2
    assert result.stderr == "error: --only: unknown check 'gpu.ec' (hint: did you mean gpu.ecc?)\n"


def test_json_document_and_exit_code(tmp_path: Path) -> None:
    result = run_fstrain("doctor", "--only", "ssh,sw.workdir,ckpt", "--checkpoint-dir", str(tmp_path / "ckpt"),
                         "--write-test-mib", "1", "--workdir", str(tmp_path / "missing"), "--json")
    assert result.returncode == 2, result.stderr
    document = json.loads(result.stdout)
    assert set(document) == {"checks", "summary"}
    checks = {(c["id"], c["verdict"]) for c in document["checks"]}
    assert ("ssh.connect", "ok") in checks and ("sw.workdir", "fail") in checks
    assert ("ckpt.space", "ok") in checks and ("ckpt.shared", "skipped") in checks
    workdir = next(c for c in document["checks"] if c["id"] == "sw.workdir")
    assert workdir == {"id": "sw.workdir", "verdict": "fail", "hosts": ["localhost"],
                       "message": f"{tmp_path / 'missing'} does not exist",
                       "fix": f"create it and put the code there (`mkdir -p {tmp_path / 'missing'}`), or use a "
                              "directory on shared storage"}
    assert document["summary"]["verdict"] == "fail" and document["summary"]["exit_code"] == 2
    assert document["summary"]["hosts"] == ["localhost"]


def test_human_output_goes_to_stderr_with_a_verdict_line(tmp_path: Path) -> None:
    result = run_fstrain("doctor", "--only", "ssh.connect,sw.workdir", "--workdir", str(tmp_path))
    assert result.returncode == 0
    assert result.stdout == ""
    assert "hosts: localhost (no --hostfile or --hosts given)" in result.stderr
    assert "ssh.connect" in result.stderr and "sw.workdir" in result.stderr
    assert result.stderr.rstrip().splitlines()[-1] == "2 checks: 2 ok, 0 skipped, 0 warn, 0 fail; verdict ok (exit 0)"


def test_plan_sizes_the_checkpoint(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    made = run_fstrain("plan", "-m", "llama3.1-8b", "--num-nodes", "2", "--gpus-per-node", "8", "--gpu", "h100-sxm",
                       "--out", str(plan))
    assert made.returncode == 0, made.stderr
    result = run_fstrain("doctor", "--only", "ckpt.space,gpu.memory", "--plan", str(plan), "--checkpoint-dir",
                         str(tmp_path), "--write-test-mib", "0", "--json")
    rows = {c["id"]: c for c in json.loads(result.stdout)["checks"]}
    # 8,030,261,248 parameters x (2 bf16 + 4 fp32 master + 8 Adam) bytes = 104.7 GiB
    assert "the plan's 104.7 GiB checkpoints" in rows["ckpt.space"]["message"] or \
        "one checkpoint of the plan is 104.7 GiB" in rows["ckpt.space"]["message"]
    assert rows["gpu.memory"]["verdict"] == "skipped"
    bad = run_fstrain("doctor", "--plan", str(tmp_path / "nope.yaml"), "--only", "ssh")
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "plan file not found" in bad.stderr


def test_table_merges_neighbouring_checks_skipped_for_one_reason() -> None:
    results = [CheckResult("gpu.count", "skipped", (), "no GPU"), CheckResult("gpu.type", "skipped", (), "no GPU"),
               CheckResult("gpu.ecc", "ok", ("a",), "fine"), CheckResult("gpu.ecc", "fail", ("b",), "bad", "fix")]
    assert table_rows(results) == [("gpu.count, gpu.type", "skipped", (), "no GPU", ""),
                                   ("gpu.ecc", "ok", ("a",), "fine", ""), ("", "fail", ("b",), "bad", "fix")]
