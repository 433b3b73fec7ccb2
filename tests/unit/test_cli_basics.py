from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import run_fstrain

HEAVY = ("torch", "deepspeed", "paramiko", "rich", "numpy")


def test_help_imports_nothing_heavy() -> None:
    code = (
        "import sys\n"
        "from fstrain.cli.main import app\n"
        "try:\n"
        "    app(['--help'], prog_name='fstrain')\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print('HEAVY=' + ','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "Usage: fstrain" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "HEAVY="


def test_version() -> None:
    result = run_fstrain("--version")
    assert result.returncode == 0 and result.stdout.startswith("fstrain 0.")


def test_exec_localhost_json() -> None:
    result = run_fstrain("exec", "--json", "--", "sh", "-c", "echo out; echo err >&2; exit 4")
    assert result.returncode == 1
    document = json.loads(result.stdout)
    assert document == {"hosts": [{
        "host": "localhost", "exit_code": 4, "stdout": "out\n", "stderr": "err\n",
        "seconds": document["hosts"][0]["seconds"], "error": None,
    }]}
    assert result.stderr == ""


def test_exec_says_it_falls_back_to_localhost() -> None:
    result = run_fstrain("exec", "--", "true")
    assert result.returncode == 0
    assert "hosts: localhost (no --hostfile or --hosts given)" in result.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "error: {path}: hostfile not found (hint: check the path given to --hostfile)"),
        (
            "a slots=2\nb slots=eight\n",
            "error: {path}:2: slots must be a positive integer, got 'eight' (hint: write slots=8)",
        ),
    ],
)
def test_bad_hostfile_is_one_line_and_exit_2(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "hosts"
    if content is not None:
        path.write_text(content)
    result = run_fstrain("exec", "--hostfile", str(path), "--", "true")
    assert result.returncode == 2
    assert result.stderr == message.format(path=path) + "\n"
    assert result.stdout == ""


def test_bad_filter_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_text("a slots=2\n")
    result = run_fstrain("exec", "--hostfile", str(path), "--include", "zz", "--", "true")
    assert result.returncode == 2
    assert result.stderr.strip() == "error: --include: unknown host 'zz' (hint: hosts are: a)"


def test_slurm_nodelist_is_used_when_no_hosts_given() -> None:
    result = run_fstrain("exec", "--json", "--timeout", "5", "--", "true",
                         env={"SLURM_JOB_NODELIST": "fstrain-test-nohost[1-2].invalid"})
    document = json.loads(result.stdout)
    assert [h["host"] for h in document["hosts"]] == ["fstrain-test-nohost1.invalid", "fstrain-test-nohost2.invalid"]
    assert all(h["error"] for h in document["hosts"])
    assert result.returncode == 1


def registered_after(argv: list[str]) -> tuple[set[str], set[str]]:
    """(top-level command names, fstrain.cli modules imported) once fstrain.cli.main is
    imported with this sys.argv, in a fresh interpreter."""
    code = (
        "import json, sys\n"
        f"sys.argv = {argv!r}\n"
        "from fstrain.cli.main import app\n"
        "names = [c.name for c in app.registered_commands] + [g.name for g in app.registered_groups]\n"
        "print(json.dumps([names, [m for m in sys.modules if m.startswith('fstrain.cli.')]]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    names, modules = json.loads(out.stdout)
    assert len(names) == len(set(names))  # nothing registered twice
    return set(names), {m.rsplit(".", 1)[1] for m in modules}


def test_a_command_loads_only_its_own_module_and_help_loads_all() -> None:
    from fstrain.cli.main import COMMAND_MODULES

    everything, _ = registered_after(["fstrain", "--help"])
    assert everything == set(COMMAND_MODULES)  # the table names every command, and only those
    assert registered_after(["fstrain", "plna"])[0] == everything  # a typo still gets "No such command"
    for command, module in COMMAND_MODULES.items():
        names, modules = registered_after(["fstrain", command])
        assert names == {c for c, m in COMMAND_MODULES.items() if m == module}, command
        assert not modules & (set(COMMAND_MODULES.values()) - {module}), (command, modules)
