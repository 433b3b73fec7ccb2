"""`fstrain launch --tensorboard` and `--metrics-textfile`: what reaches the trainer's command and
each node's watchdog header (through the real command line with --dry-run, and as values)."""

from __future__ import annotations

import shlex
from pathlib import Path

from fstrain.core.hosts.hostfile import Host
from fstrain.core.job.spec import NodeLaunch
from fstrain.io.launch import RunOptions, watchdog_header
from tests.helpers import run_fstrain

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


def test_the_watchdog_header_carries_the_textfile_folder_and_its_modules(tmp_path: Path) -> None:
    launch = NodeLaunch(host=Host("nodeA"), node_rank=1, nproc=2, argv=("python3", "x.py"), env={},
                        rank_log_dir="", backend="torchrun", rank_offset=2)
    plain = watchdog_header(launch, RunOptions(run_id="r1", run_dir=tmp_path))
    assert "metrics_textfile" not in plain and "promfile" not in plain.get("modules", {})
    header = watchdog_header(launch, RunOptions(run_id="r1", run_dir=tmp_path, metrics_textfile="/var/lib/prom"))
    assert header["metrics_textfile"] == "/var/lib/prom"
    assert sorted(header["modules"]) == ["metricline", "promfile", "stacks"]
    assert "class NodeMetrics" in header["modules"]["promfile"]
