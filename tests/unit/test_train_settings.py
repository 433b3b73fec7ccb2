"""The trainer's arguments and files are checked before torch starts: one-line errors, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fstrain.errors import ConfigError, InputError
from fstrain.io.render_files import render_and_write
from fstrain.train.settings import load_settings
from tests.plans import make_plan


@pytest.fixture
def rendered(tmp_path: Path) -> Path:
    plan = make_plan("fsdp-hybrid", dp=4, shard_group_size=2, activation_checkpointing="every-k:2")
    render_and_write(plan, tmp_path / "r", force=False)
    return tmp_path / "r"


def test_settings_from_rendered_files(rendered: Path) -> None:
    fsdp = load_settings(["--plan", str(rendered / "plan.yaml"), "--fsdp-config", str(rendered / "fsdp.yaml")], 4)
    assert (fsdp.backend, fsdp.micro_batch_size, fsdp.grad_accum_steps) == ("fsdp", 4, 2)
    assert fsdp.activation_checkpointing == "every-k:2" and fsdp.seed == 1234
    ds = load_settings(["--plan", str(rendered / "plan.yaml"), "--backend", "deepspeed",
                        "--deepspeed-config", str(rendered / "ds_config.json")], 4)
    assert ds.deepspeed is not None and ds.deepspeed["train_batch_size"] == 32
    assert ds.activation_checkpointing == "every-k:2"


def test_without_files_the_tiny_recipe_is_rendered_for_this_world() -> None:
    settings = load_settings(["--steps", "30"], 3)
    assert settings.plan.model.name == "tiny"
    assert settings.fsdp is not None and settings.fsdp["mesh"]["shape"] == [3]
    assert settings.fsdp["scheduler"] == {"warmup_steps": 3, "total_steps": 30, "min_lr_ratio": 0.1}


@pytest.mark.parametrize(
    ("args", "world", "error", "message"),
    [
        (["--fsdp-config", "{r}/fsdp.yaml"], 3, ConfigError, r"mesh 2 x 2 = 4 ranks, but WORLD_SIZE is 3"),
        (["--backend", "deepspeed", "--deepspeed-config", "{r}/ds_config.json"], 2, ConfigError,
         r"train_batch_size\(32\) != micro\(4\) x accumulation\(2\) x world\(2\)"),
        (["--deepspeed-config", "{r}/ds_config.json"], 4, InputError, "is for --backend deepspeed"),
        (["--backend", "deepspeed", "--fsdp-config", "{r}/fsdp.yaml"], 4, InputError, "is for --backend fsdp"),
        (["--fsdp-config", "{r}/plan.yaml"], 4, InputError, "not an fstrain FSDP file"),
        (["--backend", "deepspeed", "--deepspeed-config", "{r}/fsdp.yaml"], 4, InputError, "not valid JSON"),
        (["--plan", "{r}/fsdp.yaml"], 4, InputError, "not an fstrain plan"),
        (["--resume"], 1, InputError, "--resume needs --checkpoint-dir"),
        (["--steps", "0"], 1, InputError, "--steps must be at least 1"),
    ],
)
def test_bad_inputs(rendered: Path, args: list[str], world: int, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        load_settings([a.format(r=rendered) for a in args], world)


def test_a_tensor_parallel_plan_is_refused(tmp_path: Path) -> None:
    render_and_write(make_plan("zero1", dp=2, tp=2), tmp_path / "r", force=False)
    with pytest.raises(ConfigError, match="tp=2 pp=1"):
        load_settings(["--plan", str(tmp_path / "r" / "plan.yaml")], 4)


def test_an_expert_parallel_plan_is_refused(tmp_path: Path) -> None:
    from fstrain.io.recipes import load_shipped_recipe

    moe = load_shipped_recipe("tiny-moe").model
    render_and_write(make_plan("fsdp-full", dp=4, model=moe, ep=2), tmp_path / "r", force=False)
    with pytest.raises(ConfigError, match="the plan has ep=2, but the bundled trainer does not run expert"):
        load_settings(["--plan", str(tmp_path / "r" / "plan.yaml")], 4)


def test_the_command_prints_one_line_and_exits_2(rendered: Path) -> None:
    env = {**os.environ, "WORLD_SIZE": "3"}
    env.pop("FSTRAIN_DEBUG", None)
    result = subprocess.run([sys.executable, "-m", "fstrain.train", "--fsdp-config", str(rendered / "fsdp.yaml")],
                            capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: [rank 0] {rendered / 'fsdp.yaml'}: mesh 2 x 2 = 4 ranks, but WORLD_SIZE is 3 "
        "(hint: launch as many processes as the plan's dp, or re-plan for this world size)"
    ]


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32", "bf16-pure", "amp-bf16", "amp-fp16"])
def test_the_fsdp_file_says_the_precision_mode(tmp_path: Path, precision: str) -> None:
    from fstrain.train.settings import fsdp_precision

    render_and_write(make_plan("fsdp-full", dp=2, precision=precision), tmp_path / "r", force=False)
    settings = load_settings(["--plan", str(tmp_path / "r" / "plan.yaml"), "--fsdp-config",
                              str(tmp_path / "r" / "fsdp.yaml")], 2)
    assert settings.fsdp is not None and fsdp_precision(settings.fsdp) == precision


@pytest.mark.parametrize(("key", "value", "message"), [
    ("model_dtype", "float16", "model_dtype 'float16'"),
    ("autocast", "float32", "autocast 'float32'"),
])
def test_bad_precision_keys_are_refused(tmp_path: Path, key: str, value: str, message: str) -> None:
    import yaml

    render_and_write(make_plan("fsdp-full", dp=2, precision="amp-bf16"), tmp_path / "r", force=False)
    path = tmp_path / "r" / "fsdp.yaml"
    data = yaml.safe_load(path.read_text())
    data[key] = value
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InputError, match=message):
        load_settings(["--plan", str(tmp_path / "r" / "plan.yaml"), "--fsdp-config", str(path)], 2)


def test_the_launchers_environment_sets_the_checkpoint_dir_and_resumes_a_restart(tmp_path: Path) -> None:
    first = load_settings(["--steps", "4"], 2, environ={"FSTRAIN_CHECKPOINT_DIR": str(tmp_path / "ck"),
                                                       "FSTRAIN_RESTART": "0", "FSTRAIN_GRACE_S": "40"})
    assert (first.checkpoint_dir, first.resume, first.restart, first.grace_s) == (tmp_path / "ck", False, 0, 40.0)
    again = load_settings(["--steps", "4"], 2, environ={"FSTRAIN_CHECKPOINT_DIR": str(tmp_path / "ck"),
                                                       "FSTRAIN_RESTART": "2"})
    assert (again.resume, again.restart, again.grace_s) == (True, 2, 15.0)
    flag_wins = load_settings(["--checkpoint-dir", str(tmp_path / "mine")], 2,
                              environ={"FSTRAIN_CHECKPOINT_DIR": str(tmp_path / "ck")})
    assert flag_wins.checkpoint_dir == tmp_path / "mine" and not flag_wins.resume
    nowhere = load_settings([], 2, environ={"FSTRAIN_RESTART": "1"})  # nothing to resume from: step 0
    assert (nowhere.checkpoint_dir, nowhere.resume, nowhere.restart) == (None, False, 1)


@pytest.mark.parametrize(("name", "value"), [("FSTRAIN_RESTART", "one"), ("FSTRAIN_RESTART", "-1"),
                                             ("FSTRAIN_GRACE_S", "soon"), ("FSTRAIN_GRACE_S", "-3")])
def test_a_bad_launcher_variable_is_one_line(name: str, value: str) -> None:
    with pytest.raises(InputError) as raised:
        load_settings([], 2, environ={name: value})
    assert raised.value.where == name and value in raised.value.message


def test_sigterm_saves_only_a_newer_step_that_fits_the_grace_period() -> None:
    from fstrain.train.preempt import SAVE_MARGIN_S, should_save

    assert should_save(5, 4, since_signal_s=1.0, grace_s=15, save_estimate_s=3.0)
    assert should_save(5, None, since_signal_s=0.0, grace_s=15, save_estimate_s=0.0)
    assert not should_save(5, 5, since_signal_s=0.0, grace_s=15, save_estimate_s=0.0)  # saved already
    assert not should_save(5, 4, since_signal_s=10.0, grace_s=15, save_estimate_s=15 - 10 - SAVE_MARGIN_S + 0.1)
