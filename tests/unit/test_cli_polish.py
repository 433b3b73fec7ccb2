"""What a new user sees in the first minutes: named placeholders, completion, --version."""

from __future__ import annotations

import re

import pytest

from tests.helpers import run_fstrain

COMMANDS = [["exec"], ["launch"], ["plan"], ["render"], ["doctor"], ["topo", "show"], ["topo", "xml"],
            ["topo", "parse"], ["runs"], ["status"], ["logs"], ["attach"], ["stop"], ["gc"], ["bench"]]


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_help_names_every_placeholder(command: list[str]) -> None:
    result = run_fstrain(*command, "--help", env={"COLUMNS": "200"})
    assert result.returncode == 0
    # typer's unnamed placeholders look like <str>, <int range>, <path>
    assert not re.search(r"<(str|int|float|path|text|integer)[^>]*>", result.stdout, re.IGNORECASE), result.stdout
    assert not re.search(r"^\s+-\S*(, --\S+)? (TEXT|NUMBER)\s", result.stdout, re.MULTILINE), result.stdout
    options = [line.strip() for line in result.stdout.splitlines() if line.strip().startswith("-")]
    assert options


def test_placeholders_say_what_to_write() -> None:
    text = run_fstrain("launch", "--help", env={"COLUMNS": "200"}).stdout
    for fragment in ("--hostfile FILE", "--hosts HOSTS", "--include FILTER", "--nproc-per-node N|auto",
                     "--env NAME=VALUE", "--run-dir DIR", "--steps N", "[-- PROGRAM ARGS...]"):
        assert fragment in text


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_shell_completion_is_available(shell: str) -> None:
    result = run_fstrain("--show-completion", shell)
    assert result.returncode == 0, result.stderr
    assert "complete" in result.stdout.lower()


def test_tables_do_not_wrap_at_80_columns_in_logs() -> None:
    import os
    import subprocess
    import sys

    from tests.helpers import REPO

    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FSTRAIN_DEBUG")}
    result = subprocess.run([sys.executable, "-m", "fstrain", "doctor", "--only", "sw.python"], capture_output=True,
                            text=True, env=env, cwd=REPO, timeout=120, check=False)
    rows = [line for line in result.stderr.splitlines() if line.startswith(("sw.python", " "))]
    assert rows and rows[0].startswith("sw.python") and "on every host" in rows[0], result.stderr  # not folded
    assert not any(line.startswith(" ") and line.strip(" │") for line in rows[1:]), result.stderr


def test_launch_says_it_fell_back_to_localhost() -> None:
    result = run_fstrain("launch", "--dry-run", "--json", "--nproc-per-node", "1", "--", "true")
    assert result.returncode == 0, result.stderr
    assert "hosts: localhost (no --hostfile or --hosts given)" in result.stderr
    assert result.stdout.lstrip().startswith("{")


def test_dry_run_merges_a_host_named_twice_as_deepspeed(tmp_path: object) -> None:
    import base64
    import json
    from pathlib import Path

    hostfile = Path(str(tmp_path)) / "hosts"
    hostfile.write_text("worker-0 slots=4\nworker-1 slots=4\n")
    result = run_fstrain("launch", "--dry-run", "--json", "--backend", "deepspeed", "--hostfile", str(hostfile),
                         "--include", "worker-0:1@worker-0:0,1", "--", "python3", "train.py")
    assert result.returncode == 0, result.stderr
    (node,) = json.loads(result.stdout)["nodes"]
    encoded = next(a for a in node["argv"] if a.startswith("--world_info=")).split("=", 1)[1]
    assert json.loads(base64.urlsafe_b64decode(encoded)) == {"worker-0": [0, 1]}
    assert node["nproc"] == 2 and node["argv"][-1] == "train.py" and "--no_local_rank" not in node["argv"]
