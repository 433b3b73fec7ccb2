"""`fstrain render` as a user runs it: files, --json, and one-line errors with a non-zero exit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from fstrain.io.render_files import to_yaml
from tests.helpers import run_fstrain
from tests.plans import make_plan


def write_plan(path: Path, **knobs: object) -> Path:
    path.write_text(to_yaml(make_plan(**knobs).to_dict()))  # type: ignore[arg-type]
    return path


def test_render_writes_the_directory(tmp_path: Path) -> None:
    plan = write_plan(tmp_path / "plan.yaml", strategy="zero3")
    result = run_fstrain("render", "--plan", str(plan), "-o", str(tmp_path / "out"), "--ifname", "eth0",
                         "--rdma-device", "mlx5_0", "--debug-env", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["files"] == ["README", "accelerate.yaml", "ds_config.json", "fsdp.yaml", "fstrain.env", "plan.yaml"]
    assert document["out_dir"] == str(tmp_path / "out")
    assert any("no loss scaling" in note for note in document["notes"]["ds_config.json"])
    env = (tmp_path / "out" / "fstrain.env").read_text()
    assert "NCCL_DEBUG=INFO" in env and "GLOO_SOCKET_IFNAME=eth0" in env
    ds = json.loads((tmp_path / "out" / "ds_config.json").read_text())
    assert ds["wall_clock_breakdown"] is True  # --debug-env also turns on DeepSpeed's timers


def test_training_options_reach_the_files(tmp_path: Path) -> None:
    plan = write_plan(tmp_path / "plan.yaml", strategy="zero2")
    result = run_fstrain("render", "--plan", str(plan), "-o", str(tmp_path / "out"), "--lr", "0.001",
                         "--warmup-steps", "5", "--train-steps", "50")
    assert result.returncode == 0, result.stderr
    assert "rendered 6 files" in result.stderr
    ds = json.loads((tmp_path / "out" / "ds_config.json").read_text())
    assert ds["optimizer"]["params"]["lr"] == 0.001
    assert ds["scheduler"]["params"]["total_num_steps"] == 50


def test_errors_are_one_line(tmp_path: Path) -> None:
    plan = write_plan(tmp_path / "plan.yaml", strategy="zero3")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    not_a_plan = tmp_path / "fsdp.yaml"
    not_a_plan.write_text("fstrain_fsdp: 1\n")
    bad_stage = tmp_path / "bad.yaml"
    bad_stage.write_text(plan.read_text().replace("zero_stage: 3", "zero_stage: 4"))
    cases = [
        ((str(plan), str(out)), "output directory is not empty"),
        ((str(not_a_plan), str(tmp_path / "a")), "not an fstrain plan"),
        ((str(bad_stage), str(tmp_path / "b")), "zero_stage is 4"),
        ((str(tmp_path / "missing.yaml"), str(tmp_path / "c")), "file not found"),
    ]
    for (plan_arg, out_arg), message in cases:
        result = run_fstrain("render", "--plan", plan_arg, "-o", out_arg)
        assert result.returncode == 2
        assert result.stderr.startswith("error: ") and message in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert result.stdout == ""
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_render_imports_neither_torch_nor_deepspeed(tmp_path: Path) -> None:
    plan = write_plan(tmp_path / "plan.yaml", strategy="zero3")
    code = (
        "import sys\n"
        "from fstrain.cli.main import app\n"
        "try:\n"
        f"    app(['render', '--plan', {str(plan)!r}, '-o', {str(tmp_path / 'out')!r}, '--trainer', 'hf-trainer', "
        "'--trainer', 'lightning', '--trainer', 'torchtitan'], prog_name='fstrain')\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "heavy = ('torch', 'deepspeed', 'accelerate', 'transformers', 'lightning', 'torchtitan', 'mlflow', 'wandb')\n"
        "print('HEAVY=' + ','.join(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "HEAVY="
    assert (tmp_path / "out" / "ds_config.json").is_file() and (tmp_path / "out" / "torchtitan.args").is_file()


def test_trainer_configs_are_written_or_refused_in_one_line(tmp_path: Path) -> None:
    plan = write_plan(tmp_path / "plan.yaml", strategy="zero1")
    result = run_fstrain("render", "--plan", str(plan), "-o", str(tmp_path / "out"), "--trainer", "hf-trainer",
                         "--trainer", "lightning", "--json")
    assert result.returncode == 0, result.stderr
    files = json.loads(result.stdout)["files"]
    assert {"hf_training_args.json", "hf_ds_config.json", "lightning.yaml"} <= set(files)
    assert "torchtitan.args" not in files
    arguments = json.loads((tmp_path / "out" / "hf_training_args.json").read_text())
    assert arguments["deepspeed"] == str(tmp_path / "out" / "hf_ds_config.json")
    for trainer, message in (("torchtitan", "error: --trainer torchtitan: plan.strategy is zero1: "),
                             ("megatron", "error: --trainer: unknown trainer 'megatron'")):
        refused = run_fstrain("render", "--plan", str(plan), "-o", str(tmp_path / trainer), "--trainer", trainer)
        assert refused.returncode == 2 and refused.stderr.startswith(message), refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1 and "hint: " in refused.stderr
        assert not (tmp_path / trainer).exists()


def test_render_from_plan_options_matches_plan_render(tmp_path: Path) -> None:
    from tests.helpers import run_fstrain

    options = ["--model", "tiny", "--gpu", "h100-sxm", "--gpus-per-node", "2", "--strategy", "zero2"]
    direct = run_fstrain("render", "-o", str(tmp_path / "a"), *options)
    assert direct.returncode == 0, direct.stderr
    via_plan = run_fstrain("plan", *options, "--render", str(tmp_path / "b"))
    assert via_plan.returncode == 0, via_plan.stderr
    for name in ("ds_config.json", "fsdp.yaml", "accelerate.yaml", "plan.yaml"):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text().replace(
            str(tmp_path / "b"), str(tmp_path / "a"))
    nothing = run_fstrain("render", "-o", str(tmp_path / "c"))
    assert nothing.returncode == 2 and "no plan to render" in nothing.stderr
