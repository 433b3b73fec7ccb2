"""docs/api.md's examples of doctor, topo, exec, render and bench, run as a user would run them:
each ```python block of its section in a fresh interpreter, on this machine (localhost, no GPU,
no cluster), with its own HOME."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def example(section: str) -> str:
    """The first ```python block under ``## SECTION`` of docs/api.md."""
    text = (REPO / "docs" / "api.md").read_text()
    heading = f"\n## {section}\n"
    assert heading in text, f"docs/api.md lost its section {section!r}"
    body = text[text.index(heading) + len(heading):]
    body = body[:body.index("\n## ")] if "\n## " in body else body
    match = re.search(r"```python\n(.*?)```", body, re.S)
    assert match is not None, f"docs/api.md: no python example under ## {section}"
    return match.group(1)


def run_example(section: str, tmp_path: Path) -> str:
    env = {**os.environ, "HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)}
    env.pop("FSTRAIN_DEBUG", None)
    result = subprocess.run([sys.executable, "-c", example(section)], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_the_examples_come_before_the_complete_example() -> None:
    text = (REPO / "docs" / "api.md").read_text()
    positions = [text.index(f"\n## {name}\n") for name in ("Doctor", "Topology", "Exec", "Render", "Bench",
                                                             "A complete example")]
    assert positions == sorted(positions)


def test_doctor_example(tmp_path: Path) -> None:
    lines = run_example("Doctor", tmp_path).splitlines()
    assert lines[0].startswith("ssh.connect ok ('localhost',) connected and authenticated")
    assert lines[1] == "sw.workdir ok ('localhost',) . exists"
    assert lines[-1] == "verdict ok exit 0"


def test_topo_example(tmp_path: Path) -> None:
    lines = run_example("Topology", tmp_path).splitlines()
    assert lines[0].startswith("('localhost',) ") and lines[0].endswith(" GPUs")
    assert lines[1] == "['groups', 'nodes', 'reports', 'unreachable']"


def test_exec_example(tmp_path: Path) -> None:
    assert run_example("Exec", tmp_path).splitlines() == ["localhost 0 hello", "all ok"]


def test_render_example(tmp_path: Path) -> None:
    lines = run_example("Render", tmp_path).splitlines()
    assert lines[0] == "['README', 'accelerate.yaml', 'ds_config.json', 'fsdp.yaml', 'fstrain.env', 'plan.yaml']"
    assert "fp32" in lines[1]


@pytest.mark.slow  # about 8 s alone: torchrun starts 2 ranks that import torch
def test_bench_example(tmp_path: Path) -> None:
    pytest.importorskip("torch")  # the bench worker's ranks import torch (the `train` extra)
    lines = run_example("Bench", tmp_path).splitlines()
    assert lines[0] in ("exit 0 ", "exit 1 "), lines  # 1: a rank named a straggler on a loaded machine
    assert lines[1].startswith("2 ranks; ")
    assert [p.name for p in (tmp_path / "runs").iterdir() if (p / "bench.json").is_file()]
