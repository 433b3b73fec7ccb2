"""What a new user sees in the first minutes: named placeholders, completion, --version."""

from __future__ import annotations

import re

import pytest

from tests.helpers import run_fstrain

COMMANDS = [["exec"], ["launch"], ["plan"], ["render"], ["doctor"], ["topo", "show"], ["topo", "xml"],
            ["topo", "parse"]]


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_help_names_every_placeholder(command: list[str]) -> None:
    result = run_fstrain(*command, "--help", env={"COLUMNS": "200"})
    assert result.returncode == 0
    # typer's unnamed placeholders look like <str>, <int range>, <path>
    assert not re.search(r"<(str|int|float|path|text|integer)[^>]*>", result.stdout, re.IGNORECASE), result.stdout
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
