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
