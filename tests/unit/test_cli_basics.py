from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import run_fstrain

HEAVY = ("torch", "deepspeed", "paramiko", "rich", "numpy", "mlflow", "wandb")


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


def modules_loaded(argv: list[str]) -> tuple[set[str], str]:
    """(the fstrain.cli command modules imported, stderr) once the app has run with this argv, in
    a fresh interpreter whose own sys.argv is the same argv (nothing may be decided from it)."""
    code = (
        "import contextlib, io, json, sys\n"
        f"sys.argv = {argv!r}\n"
        "from fstrain.cli.main import COMMAND_MODULES, app\n"
        "commands = set(COMMAND_MODULES.values())\n"
        "at_import = [m for m in sys.modules if m.rsplit('.', 1)[-1] in commands]\n"
        "err = io.StringIO()\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):\n"
        "    try:\n"
        "        app(sys.argv[1:], prog_name='fstrain')\n"
        "    except SystemExit:\n"
        "        pass\n"
        "loaded = [m for m in sys.modules if m.startswith('fstrain.cli.') and m.rsplit('.', 1)[1] in commands]\n"
        "print(json.dumps([at_import, loaded, err.getvalue()]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    at_import, loaded, err = json.loads(out.stdout)
    assert at_import == []  # importing the app loads no command, whatever sys.argv says
    return {m.rsplit(".", 1)[1] for m in loaded}, err


def test_a_command_loads_only_its_own_module_and_help_loads_all() -> None:
    from fstrain.cli.main import COMMAND_MODULES, module_commands

    everything = set(COMMAND_MODULES.values())
    assert modules_loaded(["fstrain", "--help"])[0] == everything
    loaded, err = modules_loaded(["fstrain", "plna"])
    assert loaded == everything  # a typo still gets "No such command" and the suggestion
    assert err == "error: No such command 'plna'. Did you mean 'plan'? (hint: see `fstrain --help`)\n"
    for command, module in COMMAND_MODULES.items():
        assert modules_loaded(["fstrain", command, "--help"])[0] == {module}, command
    # the table names every command, and only those
    assert {name: module for module in everything for name in module_commands(module)} == COMMAND_MODULES


def test_usage_errors_are_one_line_without_patching_click() -> None:
    from fstrain.cli.main import app
    from fstrain.cli.usage_errors import usage_error_class

    plan = run_fstrain("plan", "--bogus")
    assert (plan.returncode, plan.stderr) == (2, "error: No such option: --bogus (Possible options: --gpu, --loss, "
                                                 "--out) (hint: see `fstrain plan --help`)\n")
    # `render` runs `plan` in-process: the usage error is still reported once, as plan's
    render = run_fstrain("render", "--model", "tiny", "--gpu", "h100-sxm", "--bogus", "--out", "unused")
    assert (render.returncode, render.stderr) == (2, plan.stderr)
    bad_value = run_fstrain("exec", "--timeout", "x", "--", "true")
    assert bad_value.stderr == "error: --timeout: 'x' is not a valid float range (hint: see `fstrain exec --help`)\n"
    bare = run_fstrain()
    assert bare.returncode == 2 and bare.stderr.startswith("Usage: ") and "Commands:" in bare.stderr  # the help
    try:
        app(["plan", "--bogus"], prog_name="fstrain", standalone_mode=False)
    except usage_error_class() as error:  # in-process callers get click's own exception
        assert type(error).__name__ == "NoSuchOption"
    else:
        raise AssertionError("no usage error")
    assert usage_error_class().show.__qualname__ == "UsageError.show"  # click's own display, untouched
