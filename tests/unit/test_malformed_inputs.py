"""Hostile and malformed inputs, one case per file of tests/fixtures/malformed (see cases.json).

Each case runs the real command line in its own process (forked from this one, so the modules
are already imported and a case costs milliseconds, not an interpreter start) under an
address-space limit and a deadline, and must end with exit code 2, exactly one ``error:`` line
that carries a hint, and no traceback. A new malformed input is a new file and a line in
cases.json, not a new test.
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import select
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "malformed"
CASES: list[dict[str, Any]] = json.loads((CORPUS / "cases.json").read_text(encoding="utf-8"))["cases"]
DEADLINE_S = 20.0  # generous for a loaded CI machine; a hang or an alias bomb takes far longer
MEMORY_LIMIT_BYTES = 2 * 1024**3  # address space above what the child starts with: an alias bomb needs many GiB
# Imported once here, so each forked case starts warm (the CLI imports these lazily).
WARM_MODULES = ("fstrain.cli.main", "fstrain.io.render_files", "fstrain.io.recipes", "fstrain.core.plan.planner",
                "fstrain.core.job.spec", "fstrain.io.connect", "rich.console", "rich.table")
for _name in WARM_MODULES:
    importlib.import_module(_name)


def _address_space_bytes() -> int:
    """This process's mapped address space (VmSize), from /proc/self/statm (in pages)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _child(args: list[str], out_fd: int, err_fd: int, home: str) -> None:  # pragma: no cover - runs forked
    try:
        # Above the address space the child inherits: the pytest process may already map a lot (torch,
        # TensorBoard, imported by earlier tests in the same run), and a limit below that fails any
        # allocation at all, which is not the input's doing.
        limit = _address_space_bytes() + MEMORY_LIMIT_BYTES
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - flushed before _exit
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        os.environ["HOME"] = home  # no ~/.deepspeed_env, ~/.ssh of the machine running the tests
        os.environ.pop("FSTRAIN_DEBUG", None)
        os.environ.pop("SLURM_JOB_NODELIST", None)
        sys.argv = ["fstrain", *args]
        from fstrain.cli.main import main

        code = 0
        try:
            main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # a traceback is what the test looks for: print it like Python would
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_forked(args: list[str], home: str) -> tuple[int, str, str, float]:
    """Run the CLI with ``args`` in a forked child: (exit code, stdout, stderr, seconds)."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(out_r)
        os.close(err_r)
        _child(args, out_w, err_w, home)
    os.close(out_w)
    os.close(err_w)
    chunks: dict[int, bytearray] = {out_r: bytearray(), err_r: bytearray()}
    open_fds = [out_r, err_r]
    while open_fds:
        left = DEADLINE_S - (time.monotonic() - start)
        if left <= 0:
            os.kill(pid, signal.SIGKILL)
            break
        ready, _, _ = select.select(open_fds, [], [], left)
        for fd in ready:
            data = os.read(fd, 65536)
            if data:
                chunks[fd] += data
            else:
                open_fds.remove(fd)
    _, status = os.waitpid(pid, 0)
    seconds = time.monotonic() - start
    for fd in (out_r, err_r):
        os.close(fd)
    code = os.waitstatus_to_exitcode(status)
    return code, chunks[out_r].decode("utf-8", "replace"), chunks[err_r].decode("utf-8", "replace"), seconds


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_malformed_input_gives_one_clear_error(case: dict[str, Any], tmp_path: Path) -> None:
    file = str(CORPUS / case["file"]) if case["file"] else ""
    args = [arg.replace("{file}", file).replace("{tmp}", str(tmp_path)) for arg in case["args"]]
    code, stdout, stderr, seconds = run_forked(args, str(tmp_path))
    assert seconds < DEADLINE_S, f"took {seconds:.1f} s (killed)"
    assert "Traceback" not in stderr, stderr
    assert code == 2, (code, stderr)
    error_lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1, stderr
    assert case["expect"] in error_lines[0]
    assert "(hint: " in error_lines[0]
    assert stdout == ""


def test_corpus_index_lists_every_file() -> None:
    named = {case["file"] for case in CASES if case["file"]}
    present = {path.name for path in CORPUS.iterdir() if path.name != "cases.json"}
    assert named == present
    assert len({case["id"] for case in CASES}) == len(CASES)
