"""The DeepSpeed backend hands a user program `--local_rank=N`, as the `deepspeed` command does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import NamespaceCluster
from tests.helpers import run_fstrain

pytestmark = pytest.mark.cluster

PROGRAM = "import json, os, sys\nprint('ARGV ' + json.dumps([os.environ['LOCAL_RANK'], *sys.argv[1:]]), flush=True)\n"


def launch_argv(cluster: NamespaceCluster, tmp_path: Path, *extra: str) -> set[str]:
    tmp_path.mkdir()
    script = tmp_path / "show_argv.py"  # the nodes share this file system
    script.write_text(PROGRAM)
    result = run_fstrain("launch", "--ssh-config", cluster.ssh_config, "--hosts", "node[1-2]", "--nproc-per-node",
                         "1", "--backend", "deepspeed", "--grace", "5", "--run-dir", str(tmp_path / "run"), *extra,
                         "--", "python3", str(script), "--lr", "1", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return {line.split("ARGV ", 1)[1] for line in result.stdout.splitlines() if "ARGV " in line}


def test_deepspeed_backend_appends_local_rank_unless_told_not_to(cluster: NamespaceCluster, tmp_path: Path) -> None:
    seen = launch_argv(cluster, tmp_path / "with")
    assert {tuple(json.loads(text)) for text in seen} == {("0", "--local_rank=0", "--lr", "1")}
    seen = launch_argv(cluster, tmp_path / "without", "--no-local-rank")
    assert {tuple(json.loads(text)) for text in seen} == {("0", "--lr", "1")}
