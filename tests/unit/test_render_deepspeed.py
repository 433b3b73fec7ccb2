"""The DeepSpeed renderer: values, errors, and every variant read by DeepSpeed's own config class.

DeepSpeed's pydantic sections (zero_optimization, bf16, fp16, comms_logger) forbid unknown keys;
the others are plain dict lookups that silently ignore a typo. So every rendered config is
loaded through ``deepspeed.runtime.config.DeepSpeedConfig`` with a dict that records which keys
DeepSpeed looked up, and a key it never read fails the test.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import warnings
from typing import Any

import pytest

from fstrain.core.plan.modelsize import count_parameters
from fstrain.core.render import TrainingOptions, render_deepspeed
from fstrain.core.render.deepspeed import bucket_sizes
from fstrain.errors import ConfigError, FstrainError, InputError
from fstrain.io.recipes import load_shipped_recipe
from tests.plans import TINY_MODEL, make_plan

STRATEGIES = ("ddp", "zero1", "zero2", "zero3")
TINY_PARAMS = count_parameters(TINY_MODEL).total  # the buckets of the test model: its size


def variants() -> list[tuple[str, str, str, str, str]]:
    """(strategy, precision, offload, activation checkpointing, optimizer) combinations DeepSpeed accepts."""
    out = []
    for strategy, precision, offload, ac, optimizer in itertools.product(
        STRATEGIES, ("bf16", "fp16", "fp32"), ("none", "optimizer", "optimizer+params"),
        ("none", "selective-op", "every-k:2", "full", "megatron-selective"), ("adamw", "sgd", "adam8bit"),
    ):
        if offload != "none" and strategy == "ddp":
            continue
        if offload == "optimizer+params" and strategy != "zero3":
            continue
        out.append((strategy, precision, offload, ac, optimizer))
    # Autocast (DeepSpeed's torch_autocast section): every stage for bf16, stage 0 for fp16 (the
    # engine's GradScaler is stage 0's only; ZeRO refuses amp-fp16).
    for strategy, offload in itertools.product(STRATEGIES, ("none", "optimizer")):
        if offload != "none" and strategy == "ddp":
            continue
        out.append((strategy, "amp-bf16", offload, "full", "adamw"))
    out.append(("ddp", "amp-fp16", "none", "full", "adamw"))
    return out


VARIANTS = variants()


class Recording(dict):  # type: ignore[type-arg]
    """A dict that logs every key DeepSpeed reads, under its dotted path."""

    def __init__(self, data: dict[str, Any], log: set[str], prefix: str = "") -> None:
        super().__init__(
            {k: Recording(v, log, f"{prefix}{k}.") if isinstance(v, dict) else v for k, v in data.items()}
        )
        self.log = log
        self.prefix = prefix

    def __getitem__(self, key: str) -> Any:
        self.log.add(self.prefix + key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.log.add(self.prefix + key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self.log.add(self.prefix + str(key))
        return super().__contains__(key)


class DataParallelOnly:
    """The ``mpu`` argument DeepSpeed takes the data-parallel world size from."""

    def __init__(self, dp: int) -> None:
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


# Sections DeepSpeed validates with pydantic models that forbid extra keys: their inner keys
# are checked by construction, so only their names must be read.
STRICT_SECTIONS = ("zero_optimization", "bf16", "fp16", "comms_logger")
# Passed as keyword arguments to the optimizer / scheduler class at deepspeed.initialize time.
CALL_SECTIONS = ("optimizer.params", "scheduler.params")


def unread_keys(config: dict[str, Any], log: set[str], prefix: str = "") -> list[str]:
    missing = []
    for key, value in config.items():
        path = prefix + key
        if path not in log:
            missing.append(path)
        if isinstance(value, dict) and path not in STRICT_SECTIONS and path not in CALL_SECTIONS:
            missing += unread_keys(value, log, path + ".")
    return missing


@pytest.fixture(scope="module")
def ds() -> Any:
    import deepspeed.comm
    import deepspeed.runtime.config
    import deepspeed.runtime.lr_schedules

    return deepspeed


def load_with_deepspeed(
    ds: Any, config: dict[str, Any], dp: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, set[str]]:
    # DeepSpeedConfig asks deepspeed.comm for the rank before it consults mpu; with no process
    # group that call fails and it assumes a world of 1. Rank 0 is the truth for a config check.
    monkeypatch.setattr(ds.comm, "get_rank", lambda group=None: 0)
    log: set[str] = set()
    loaded = ds.runtime.config.DeepSpeedConfig(Recording(config, log), mpu=DataParallelOnly(dp))
    return loaded, log


def call_parameters(target: Any) -> set[str]:
    return {name for name in inspect.signature(target).parameters if name not in ("self", "params", "optimizer")}


@pytest.mark.parametrize(("strategy", "precision", "offload", "ac", "optimizer"), VARIANTS)
def test_deepspeed_reads_every_rendered_key(
    ds: Any, monkeypatch: pytest.MonkeyPatch, strategy: str, precision: str, offload: str, ac: str, optimizer: str
) -> None:
    import torch

    plan = make_plan(strategy, dp=8, precision=precision, offload=offload, activation_checkpointing=ac,
                     optimizer=optimizer, micro_batch_size=3, grad_accum_steps=5)
    config = render_deepspeed(plan, TrainingOptions(total_steps=1000 if ac == "full" else 0)).config
    loaded, log = load_with_deepspeed(ds, config, dp=8, monkeypatch=monkeypatch)
    assert unread_keys(config, log) == []
    # DeepSpeed's own batch arithmetic agrees: 3 x 5 x 8.
    assert (loaded.train_batch_size, loaded.train_micro_batch_size_per_gpu, loaded.gradient_accumulation_steps) == (
        120, 3, 5)
    assert loaded.zero_optimization_stage == plan.knobs.zero_stage
    assert loaded.bfloat16_config.enabled == (precision == "bf16")
    assert loaded.float16_config.enabled == (precision == "fp16")
    assert loaded.torch_autocast_enabled == precision.startswith("amp-")
    if precision.startswith("amp-"):
        assert loaded.torch_autocast_dtype == {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}[precision]
    zero = loaded.zero_config
    if offload != "none":
        assert zero.offload_optimizer.device == "cpu" and zero.offload_optimizer.pin_memory
    assert (zero.offload_param is not None) == (offload == "optimizer+params")
    if strategy != "ddp":
        assert zero.reduce_bucket_size == TINY_PARAMS and zero.overlap_comm
    if strategy == "zero3":
        assert (zero.prefetch_bucket_size, zero.param_persistence_threshold) == (TINY_PARAMS, 100_000)
    # selective-op is torch's own (no section); every-k:2 checkpoints one of the 2 blocks.
    expected_checkpoints = {"none": None, "selective-op": None, "every-k:2": 1}.get(ac, 2)
    assert loaded.activation_checkpointing_config.number_checkpoints == expected_checkpoints
    # The optimizer and scheduler blocks become keyword arguments: they must name real parameters.
    if optimizer == "adam8bit":
        assert loaded.optimizer_name is None
    else:
        params = dict(loaded.optimizer_params)
        params.pop("torch_adam", None)  # consumed by DeepSpeed before it builds the optimizer
        cls = {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[optimizer]
        if optimizer == "adamw" and offload != "none":
            from deepspeed.ops.adam import DeepSpeedCPUAdam as cls  # what DeepSpeed builds for offload
        assert set(params) <= call_parameters(cls)
    scheduler = getattr(ds.runtime.lr_schedules, loaded.scheduler_name)
    assert set(loaded.scheduler_params) <= call_parameters(scheduler)


def test_the_key_check_catches_a_typo(ds: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    config = render_deepspeed(make_plan("zero2")).config
    config["gradient_clippng"] = 1.0  # DeepSpeed ignores this silently
    _, log = load_with_deepspeed(ds, config, dp=2, monkeypatch=monkeypatch)
    assert unread_keys(config, log) == ["gradient_clippng"]


def test_deepspeed_rejects_unknown_keys_in_strict_sections(ds: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # Why the inner keys of the STRICT_SECTIONS need no recording.
    config = render_deepspeed(make_plan("zero3")).config
    config["zero_optimization"]["stage3_prefetch_bucket"] = 1
    with pytest.raises(Exception, match="stage3_prefetch_bucket"):
        load_with_deepspeed(ds, config, dp=2, monkeypatch=monkeypatch)


def test_deepspeed_agrees_the_batch_is_inconsistent_for_another_world(ds: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    config = render_deepspeed(make_plan("zero1", dp=4)).config
    with pytest.raises(AssertionError, match="train_batch_size"):
        load_with_deepspeed(ds, config, dp=2, monkeypatch=monkeypatch)


@pytest.mark.parametrize(("dp", "micro", "accum"), [(1, 1, 1), (2, 4, 2), (64, 2, 16), (1024, 1, 3)])
def test_train_batch_size_is_micro_times_accum_times_dp(dp: int, micro: int, accum: int) -> None:
    config = render_deepspeed(make_plan("zero2", dp=dp, micro_batch_size=micro, grad_accum_steps=accum)).config
    assert config["train_batch_size"] == micro * accum * dp
    assert config["train_micro_batch_size_per_gpu"] == micro
    assert config["gradient_accumulation_steps"] == accum


def test_bucket_sizes_are_deepspeeds_defaults_capped_at_the_model() -> None:
    # DeepSpeed 0.19.8's defaults (deepspeed/runtime/zero/config.py), read from its own config
    # class so a DeepSpeed that changes them fails here.
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    defaults = DeepSpeedZeroConfig(stage=3)
    assert bucket_sizes(10**12) == {
        "reduce_bucket_size": defaults.reduce_bucket_size,
        "allgather_bucket_size": defaults.allgather_bucket_size,
        "stage3_prefetch_bucket_size": defaults.prefetch_bucket_size,
        "stage3_param_persistence_threshold": defaults.param_persistence_threshold,
    }
    # DeepSpeed allocates the whole bucket, so a small model's is its size.
    assert bucket_sizes(30_000_000) == {"reduce_bucket_size": 30_000_000, "allgather_bucket_size": 30_000_000,
                                        "stage3_prefetch_bucket_size": 30_000_000,
                                        "stage3_param_persistence_threshold": 100_000}
    gpt2 = dataclasses.replace(make_plan("zero2"), model=load_shipped_recipe("gpt2-1.5b").model)
    zero2 = render_deepspeed(gpt2).config["zero_optimization"]
    assert (zero2["reduce_bucket_size"], zero2["allgather_bucket_size"]) == (500_000_000, 500_000_000)
    zero3 = render_deepspeed(dataclasses.replace(gpt2, knobs=make_plan("zero3").knobs)).config["zero_optimization"]
    assert (zero3["reduce_bucket_size"], zero3["stage3_prefetch_bucket_size"],
            zero3["stage3_param_persistence_threshold"]) == (500_000_000, 50_000_000, 100_000)
    assert "allgather_bucket_size" not in zero3  # stage 3 gathers with its prefetcher
    tiny = count_parameters(TINY_MODEL).total
    assert render_deepspeed(make_plan("zero3")).config["zero_optimization"]["reduce_bucket_size"] == tiny


def test_zero_sections_per_stage() -> None:
    assert render_deepspeed(make_plan("ddp")).config["zero_optimization"] == {"stage": 0}
    zero1 = render_deepspeed(make_plan("zero1")).config["zero_optimization"]
    assert zero1 == {"stage": 1, "overlap_comm": True, "contiguous_gradients": True,
                     "reduce_bucket_size": TINY_PARAMS, "allgather_bucket_size": TINY_PARAMS}
    zero3 = render_deepspeed(make_plan("zero3", offload="optimizer+params")).config["zero_optimization"]
    assert zero3["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert zero3["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert zero3["stage3_max_live_parameters"] == 1_000_000_000


def test_precision_sections_and_notes() -> None:
    bf16 = render_deepspeed(make_plan("zero2", precision="bf16"))
    assert bf16.config["bf16"] == {"enabled": True} and "fp16" not in bf16.config
    assert any("no loss scaling" in note for note in bf16.notes)
    fp16 = render_deepspeed(make_plan("zero2", precision="fp16"))
    assert fp16.config["fp16"] == {"enabled": True, "loss_scale": 0, "initial_scale_power": 16,
                                   "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1}
    assert "bf16" not in fp16.config
    fp32 = render_deepspeed(make_plan("zero2", precision="fp32"))
    assert "bf16" not in fp32.config and "fp16" not in fp32.config
    amp = render_deepspeed(make_plan("zero3", precision="amp-bf16"))
    assert amp.config["torch_autocast"] == {"enabled": True, "dtype": "bfloat16"}
    assert "bf16" not in amp.config and "fp16" not in amp.config
    assert render_deepspeed(make_plan("ddp", precision="amp-fp16")).config["torch_autocast"]["dtype"] == "float16"


def test_modes_deepspeed_does_not_run_are_refused_or_marked() -> None:
    for strategy in ("zero1", "zero3"):
        with pytest.raises(FstrainError, match="bf16-pure with strategy"):
            render_deepspeed(make_plan(strategy, precision="bf16-pure"))
        with pytest.raises(FstrainError, match="amp-fp16 with strategy"):
            render_deepspeed(make_plan(strategy, precision="amp-fp16"))
    # An FSDP plan's DeepSpeed file is an equivalent: the nearest mode DeepSpeed runs, said in a note.
    pure = render_deepspeed(make_plan("fsdp-full", precision="bf16-pure"))
    assert pure.config["bf16"] == {"enabled": True} and any("fsdp.yaml runs pure bf16" in n for n in pure.notes)
    amp16 = render_deepspeed(make_plan("fsdp-full", precision="amp-fp16"))
    assert amp16.config["fp16"]["enabled"] and "torch_autocast" not in amp16.config
    assert any("no loss scaler with ZeRO" in n for n in amp16.notes)


def test_optimizer_and_scheduler_blocks() -> None:
    options = TrainingOptions(lr=1e-3, warmup_steps=10, total_steps=0)
    config = render_deepspeed(make_plan("zero1"), options).config
    assert config["optimizer"] == {"type": "AdamW", "params": {
        "lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1, "torch_adam": True}}
    assert config["scheduler"] == {"type": "WarmupLR", "params": {
        "warmup_min_lr": 1e-4, "warmup_max_lr": 1e-3, "warmup_num_steps": 10, "warmup_type": "linear"}}
    cosine = render_deepspeed(make_plan("zero1"), TrainingOptions(warmup_steps=4, total_steps=100)).config
    assert cosine["scheduler"] == {"type": "WarmupCosineLR", "params": {
        "total_num_steps": 100, "warmup_min_ratio": 0.25, "warmup_num_steps": 4, "cos_min_ratio": 0.1,
        "warmup_type": "linear"}}
    constant = render_deepspeed(make_plan("zero1"), TrainingOptions(warmup_steps=0)).config
    assert "scheduler" not in constant
    offload = render_deepspeed(make_plan("zero2", offload="optimizer")).config
    assert "torch_adam" not in offload["optimizer"]["params"]  # DeepSpeedCPUAdam does the offloaded step
    sgd = render_deepspeed(make_plan("zero2", optimizer="sgd")).config
    assert sgd["optimizer"]["type"] == "SGD" and sgd["zero_allow_untested_optimizer"] is True
    adam8bit = render_deepspeed(make_plan("zero2", optimizer="adam8bit"))
    assert "optimizer" not in adam8bit.config
    assert any("bitsandbytes" in note for note in adam8bit.notes)


def test_debug_turns_on_timers_and_comms_logger() -> None:
    plain = render_deepspeed(make_plan("zero3")).config
    debug = render_deepspeed(make_plan("zero3"), debug=True).config
    assert (plain["wall_clock_breakdown"], plain["comms_logger"]["enabled"]) == (False, False)
    assert (debug["wall_clock_breakdown"], debug["comms_logger"]["enabled"]) == (True, True)


def test_activation_checkpointing_section_only_when_asked() -> None:
    assert "activation_checkpointing" not in render_deepspeed(make_plan("zero3")).config
    section = render_deepspeed(make_plan("zero3", activation_checkpointing="full")).config["activation_checkpointing"]
    assert section == {"partition_activations": False, "cpu_checkpointing": False,
                       "contiguous_memory_optimization": False, "number_checkpoints": 2,
                       "synchronize_checkpoint_boundary": False, "profile": False}
    tp = render_deepspeed(make_plan("zero1", dp=2, tp=4, activation_checkpointing="megatron-selective"))
    assert tp.config["activation_checkpointing"]["partition_activations"] is True
    assert any("mpu" in note for note in tp.notes)


def test_a_stage_deepspeed_does_not_have_is_refused() -> None:
    with pytest.raises(InputError, match=r"zero_stage is 4 .*stages 0, 1, 2 and 3"):
        render_deepspeed(make_plan("zero3", zero_stage=4))


@pytest.mark.parametrize(
    ("strategy", "offload", "message"),
    [("zero2", "optimizer+params", "stage 3 only"), ("ddp", "optimizer", "stage 1 or more")],
)
def test_offload_the_stage_cannot_do_is_refused(strategy: str, offload: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        render_deepspeed(make_plan(strategy, offload=offload))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (TrainingOptions(lr=0), "lr must be positive"),
        (TrainingOptions(warmup_steps=0, total_steps=10), "warmup_steps >= 1"),
        (TrainingOptions(warmup_steps=50, total_steps=10), "shorter than warmup_steps"),
        (TrainingOptions(gradient_clipping=-1), "gradient_clipping"),
    ],
)
def test_bad_options_are_refused(options: TrainingOptions, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        render_deepspeed(make_plan("zero1"), options)


def test_render_is_deterministic() -> None:
    plan = make_plan("zero3", offload="optimizer", activation_checkpointing="full")
    assert render_deepspeed(plan) == render_deepspeed(plan)


class _EngineConfigView:
    """The part of ``DeepSpeedEngine`` that picks the optimizer wrapper, over a loaded config."""

    def __init__(self, ds: Any, config: Any, pipeline: bool) -> None:
        engine = ds.runtime.engine.DeepSpeedEngine
        self._config, self.pipeline_parallelism, self.global_rank = config, pipeline, 0
        for name in ("get_data_types", "fp16_enabled", "bfloat16_enabled", "zero_optimization",
                     "zero_optimization_stage", "zero_cpu_offload", "zero_compute_grad_norm",
                     "zero_allow_untested_optimizer", "_do_optimizer_sanity_check"):
            setattr(self, name, getattr(engine, name).__get__(self))


@pytest.mark.parametrize(("strategy", "pp", "grad_accum_dtype", "wrapper"), [
    ("zero1", 1, None, "ZERO_OPTIMIZATION"),
    ("zero1", 2, None, "ZERO_OPTIMIZATION"),  # what fstrain renders: the ZeRO optimizer, not BF16_Optimizer
    ("zero1", 2, "fp32", "BFLOAT16"),  # data_types.grad_accum_dtype fp32 (not rendered): BF16_Optimizer
    ("ddp", 2, None, "BFLOAT16"),  # stage 0 + bf16 + DeepSpeed's pipeline engine: BF16_Optimizer
    ("ddp", 1, None, "DDP_BFLOAT16"),  # stage 0 + bf16: FP16_Optimizer over bf16
])
def test_which_deepspeed_optimizer_wraps_a_bf16_plan(
    ds: Any, monkeypatch: pytest.MonkeyPatch, strategy: str, pp: int, grad_accum_dtype: str | None, wrapper: str
) -> None:
    """DeepSpeed's BF16_Optimizer keeps a full fp32 gradient buffer (runtime/bf16_optimizer.py:
    ``fp32_groups_gradients_flat``, the size of the whole 16-bit flat group), but the engine only
    picks it for ZeRO-1 with ``data_types.grad_accum_dtype: fp32`` or for stage 0 under its
    pipeline engine. fstrain renders neither for a zero1 plan (so the planner's zero1 is the ZeRO
    optimizer's 2 + 2 + 16/N); a ddp plan's primary file is fsdp.yaml (torch DDP)."""
    import deepspeed.runtime.engine  # noqa: F401  (the module the wrapper is picked in)
    import torch

    rendered = render_deepspeed(make_plan(strategy, dp=2, pp=pp, precision="bf16")).config
    if grad_accum_dtype:
        rendered = {**rendered, "data_types": {"grad_accum_dtype": grad_accum_dtype}}
    loaded, _ = load_with_deepspeed(ds, rendered, 2, monkeypatch)
    view = _EngineConfigView(ds, loaded, pipeline=pp > 1)
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])
    with warnings.catch_warnings():
        # The check imports DeepSpeed's Muon optimizer, which compiles with torch.compile at import;
        # inductor's modules use torch.jit.script_method, deprecated in this torch.
        warnings.simplefilter("ignore", DeprecationWarning)
        picked = view._do_optimizer_sanity_check(optimizer)
    assert picked == getattr(ds.runtime.engine, wrapper)
