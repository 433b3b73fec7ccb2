"""docs/api.md's complete example, run as a user would run it: plan, train the tiny recipe on 2
local CPU processes through `fstrain.api.launch`, read the run back."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.train

REPO = Path(__file__).resolve().parents[2]


def complete_example() -> str:
    text = (REPO / "docs" / "api.md").read_text()
    section = text[text.index("## A complete example"):]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "docs/api.md lost its complete example"
    return match.group(1)


def test_the_documented_example_plans_trains_and_reads_the_run_back(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", complete_example()], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trained 3 steps" in result.stdout
    assert "[localhost r0] [fstrain.train]" in result.stdout  # the ranks' lines, and logs(tail=2) read back
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1 and (runs[0] / "manifest.json").is_file()
    assert (tmp_path / "home" / ".fstrain" / "launched").is_dir()  # registered for `fstrain runs`
