"""Helpers for tests that run the real `fstrain` command line in a subprocess."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from fstrain.core.runs.manifest import Manifest

REPO = Path(__file__).resolve().parent.parent


def require_tool(name: str, install: str) -> str:
    """The path of ``name``, a test dependency that scripts/install-test-deps.sh installs: without
    it the test fails (a skipped check would look like a passing one)."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed, and the tests need it: run scripts/install-test-deps.sh "
                    f"(or {install})", pytrace=False)
    return path


def run_fstrain(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 120, input_text: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m fstrain ARGS`` as a user would, capturing stdout and stderr separately."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("FSTRAIN_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "fstrain", *args],
        capture_output=True, text=True, env=full_env, timeout=timeout, cwd=REPO, input=input_text, check=False,
    )


def python_without(folder: Path, package: str) -> str:
    """An interpreter (this one) that cannot import ``package``, as a host's python3 without it:
    a wrapper whose PYTHONPATH starts with a sitecustomize that blocks the import (written into
    ``folder``)."""
    hide = folder / f"without-{package}"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(f"import sys\nsys.modules[{package!r}] = None  # importing it fails\n")
    wrapper = folder / f"python-without-{package}"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={shlex.quote(str(hide))}${{PYTHONPATH:+:$PYTHONPATH}} '
                       f'exec {shlex.quote(sys.executable)} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def interruptible() -> None:
    """A ``preexec_fn`` (and a pty child's first step) for a program a test will Ctrl-C: SIGINT
    reaches it as on a user's terminal, default and unblocked, whatever disposition or mask the
    test runner's process hands down (an ignored or blocked SIGINT is inherited across exec)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def manifest(**fields: Any) -> Manifest:
    """A run manifest with ``fields``, read as fstrain reads manifest.json (a run id and backend
    unless given)."""
    return Manifest.from_dict({"run_id": "r", "backend": "torchrun", **fields}, "test manifest")
