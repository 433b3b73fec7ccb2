"""`fstrain launch --tensorboard` and `--metrics-textfile`: what reaches the trainer's command and
each node's watchdog header (through the real command line with --dry-run, and as values)."""

from __future__ import annotations

import shlex
from pathlib import Path

from fstrain.core.hosts.hostfile import Host
from fstrain.core.job.spec import NodeLaunch
from fstrain.io.launch import RunOptions, watchdog_header
from tests.helpers import python_without, run_fstrain

DRY = ("launch", "--dry-run", "--hosts", "nodeA,nodeB", "--nproc-per-node", "1")


def test_tensorboard_reaches_the_bundled_trainer_on_every_node() -> None:
    result = run_fstrain(*DRY, "--model", "tiny", "--steps", "3", "--tensorboard", "{run_dir}/tb")
    assert result.returncode == 0, result.stderr
    commands = [shlex.split(line) for line in result.stdout.splitlines() if "fstrain.train" in line]
    assert len(commands) == 2
    for argv in commands:
        at = argv.index("--tensorboard")
        assert argv[at + 1] == "{run_dir}/tb"


def test_tensorboard_with_a_program_of_ones_own_is_one_line() -> None:
    result = run_fstrain(*DRY, "--tensorboard", "tb", "--", "python3", "train.py")
    assert result.returncode == 2
    assert result.stderr.startswith("error: --tensorboard: the flag is the bundled trainer's"), result.stderr
    assert result.stderr.count("\n") == 1


def test_tensorboard_where_the_package_is_missing_stops_the_launch_in_the_preflight(tmp_path: Path) -> None:
    """A real launch on this machine whose interpreter cannot import tensorboard: one line naming
    the host and the fix, before any rank starts (not rank 0's own refusal after the start)."""
    without = python_without(tmp_path, "tensorboard")
    run_dir, board = tmp_path / "run", tmp_path / "tb"
    result = run_fstrain("launch", "--model", "tiny", "--steps", "1", "--nproc-per-node", "1", "--python", without,
                         "--run-dir", str(run_dir), "--tensorboard", str(board),
                         env={"HOME": str(tmp_path)}, timeout=300)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [result.stderr.splitlines()[-1]], result.stderr
    assert errors[0].startswith(f"error: launch: preflight failed on localhost: {without} ("), errors
    assert "cannot import tensorboard (hint:" in errors[0] and "-m pip install tensorboard" in errors[0], errors
    assert "[rank 0]" not in result.stderr and result.stdout == "", result.stdout  # no rank ran
    assert not board.exists() and not (run_dir / "logs").exists() and not (run_dir / "manifest.json").exists()


def test_the_watchdog_header_carries_the_textfile_folder_and_its_modules(tmp_path: Path) -> None:
    launch = NodeLaunch(host=Host("nodeA"), node_rank=1, nproc=2, argv=("python3", "x.py"), env={},
                        rank_log_dir="", backend="torchrun", rank_offset=2)
    plain = watchdog_header(launch, RunOptions(run_id="r1", run_dir=tmp_path))
    assert "metrics_textfile" not in plain and "promfile" not in plain.get("modules", {})
    header = watchdog_header(launch, RunOptions(run_id="r1", run_dir=tmp_path, metrics_textfile="/var/lib/prom"))
    assert header["metrics_textfile"] == "/var/lib/prom"
    assert sorted(header["modules"]) == ["metricline", "promfile", "stacks"]
    assert "class NodeMetrics" in header["modules"]["promfile"]
