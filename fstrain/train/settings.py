"""What the trainer runs: read from the command line and the rendered files, validated first.

Everything here is torch-free, so a bad argument or file fails in milliseconds, before any
process group exists, with the one-line error every fstrain command prints.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fstrain.core.job.plan import check_supported, check_trainer_loss, check_trainer_optimizer
from fstrain.core.plan.acpolicy import parse_ac
from fstrain.core.plan.losses import loss_chunks
from fstrain.core.plan.planfile import PlanFile
from fstrain.core.plan.schema import PlanKnobs
from fstrain.core.render.deepspeed import render_deepspeed
from fstrain.core.render.fsdp import FSDP_FILE_VERSION, render_fsdp
from fstrain.core.render.options import TrainingOptions
from fstrain.errors import ConfigError, InputError
from fstrain.train.metrics import METRICS_FOLDER

BACKENDS = ("fsdp", "deepspeed")
# fstrain's own grace period (launch --grace, fstrain/core/launch/supervisor.py Limits.grace_s),
# when the launcher does not say (FSTRAIN_GRACE_S, which fstrain's node watchdog sets).
DEFAULT_GRACE_S = 15.0
_PRECISION_OF_DTYPE = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


@dataclass(frozen=True)
class TrainSettings:
    """One training run: the plan (model + knobs), the backend's file, and the run's options."""

    plan: PlanFile
    backend: str
    fsdp: Mapping[str, Any] | None  # the fsdp.yaml content (backend fsdp)
    deepspeed: dict[str, Any] | None  # the ds_config.json content (backend deepspeed)
    steps: int
    seed: int
    checkpoint_dir: Path | None
    checkpoint_interval: int
    resume: bool
    summary_json: Path | None
    log_every: int
    metrics_dir: Path | None = None  # each rank's metrics.jsonl goes here: rank<R>.jsonl
    tensorboard_dir: Path | None = None  # rank 0's TensorBoard event files
    restart: int = 0  # FSTRAIN_RESTART: how many times the launcher restarted the run (> 0 resumes)
    grace_s: float = DEFAULT_GRACE_S  # FSTRAIN_GRACE_S: SIGTERM to SIGKILL, what a save on SIGTERM may take

    @property
    def micro_batch_size(self) -> int:
        if self.deepspeed is not None:
            return int(self.deepspeed["train_micro_batch_size_per_gpu"])
        assert self.fsdp is not None
        return int(self.fsdp["batch"]["micro_batch_size"])

    @property
    def grad_accum_steps(self) -> int:
        if self.deepspeed is not None:
            return int(self.deepspeed["gradient_accumulation_steps"])
        assert self.fsdp is not None
        return int(self.fsdp["batch"]["grad_accum_steps"])

    @property
    def loss_chunks(self) -> int:
        """Chunks of tokens the loss is computed in: the plan's ``--loss chunked:N``, else 1."""
        return loss_chunks(self.plan.knobs.loss)

    @property
    def activation_checkpointing(self) -> str:
        """The policy (fstrain.core.plan.acpolicy) the model applies to each block."""
        if self.fsdp is not None:
            return parse_ac(self.fsdp.get("activation_checkpointing", "none"), "fsdp.yaml: activation_checkpointing")
        knob = self.plan.knobs.activation_checkpointing
        if knob == "none" and self.deepspeed is not None and "activation_checkpointing" in self.deepspeed:
            return "full"  # the DeepSpeed file asks for it; checkpoint whole blocks
        return knob


def check_compiler_toolchain() -> None:
    """torch.compile's Inductor builds C++ kernels for CPU tensors (and uses Triton, bundled with
    CUDA torch, on GPUs): without a C++ compiler a CPU run would fail at its first step."""
    import shutil

    import torch

    if torch.cuda.is_available():
        return
    compilers = [os.environ.get("CXX", ""), "g++", "c++", "clang++"]
    if not any(name and shutil.which(name) for name in compilers):
        raise ConfigError(
            "the plan is for torch.compile, and on CPU Inductor needs a C++ compiler, but none was found "
            "(CXX, g++, c++, clang++)",
            "install one (Debian/Ubuntu: apt-get install g++), or re-plan without --compile",
            "--plan",
        )


def check_tensorboard() -> None:
    """--tensorboard writes through torch.utils.tensorboard, which needs the tensorboard package:
    checked before any process group exists, without importing it."""
    import importlib.util

    from fstrain.core.job.plan import TENSORBOARD_PACKAGE

    if importlib.util.find_spec(TENSORBOARD_PACKAGE) is None:
        raise ConfigError(
            "the tensorboard package, which it writes through, is not installed in this Python",
            "pip install 'fstrain[tensorboard]' (or pip install tensorboard) where rank 0 runs, or leave out "
            "--tensorboard",
            "--tensorboard",
        )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m fstrain.train",
        description="fstrain's reference trainer: a small GPT on synthetic data, with a rendered FSDP2 "
        "or DeepSpeed config. Launch it with torchrun or the deepspeed launcher.",
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument("--plan", type=Path, help="plan.yaml: the model and the parallel knobs")
    source.add_argument("--model", help="a shipped recipe name (default: tiny)")
    source.add_argument("--recipe", type=Path, help="a recipe file (--model-config is an alias)")
    source.add_argument("--model-config", dest="recipe", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--backend", choices=BACKENDS, default="fsdp")
    p.add_argument("--fsdp-config", type=Path, help="fsdp.yaml from `fstrain render` (backend fsdp)")
    p.add_argument("--deepspeed-config", type=Path, help="ds_config.json from `fstrain render` (backend deepspeed)")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps in total (a resumed run stops here too)")
    p.add_argument("--seed", type=int, default=None, help="model init and data seed (default: the file's, or 1234)")
    p.add_argument("--checkpoint-dir", type=Path,
                   help="where checkpoints go (one folder per saved step); default $FSTRAIN_CHECKPOINT_DIR")
    p.add_argument("--checkpoint-interval", type=int, default=0, help="save every N steps (0: only at the end)")
    p.add_argument(
        "--resume", action="store_true",
        help="continue from the latest checkpoint in --checkpoint-dir, if any (implied by FSTRAIN_RESTART > 0)"
    )
    p.add_argument("--summary-json", type=Path, help="write the final summary here (rank 0)")
    p.add_argument("--log-every", type=int, default=1,
                   help="log every N steps: rank 0's progress line, every rank's metric line")
    p.add_argument("--metrics-dir", type=Path,
                   help="each rank appends its logged steps to DIR/rank<R>.jsonl (default: "
                   "$FSTRAIN_RUN_DIR/metrics when fstrain launched it, else none)")
    p.add_argument("--tensorboard", type=Path, metavar="DIR",
                   help="rank 0 writes TensorBoard event files of each logged step here (needs the tensorboard "
                   "package: pip install 'fstrain[tensorboard]')")
    # The deepspeed launcher appends --local_rank; LOCAL_RANK in the environment is what we use.
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return p


def load_settings(argv: list[str] | None, world_size: int, environ: Mapping[str, str] | None = None) -> TrainSettings:
    env = os.environ if environ is None else environ
    args = parser().parse_args(argv)
    if args.checkpoint_dir is None and env.get("FSTRAIN_CHECKPOINT_DIR", "").strip():
        args.checkpoint_dir = Path(env["FSTRAIN_CHECKPOINT_DIR"].strip())
    restart = _whole(env, "FSTRAIN_RESTART", "the launcher's restart count", 0)
    grace_s = _seconds(env, "FSTRAIN_GRACE_S", DEFAULT_GRACE_S)
    if restart > 0 and args.checkpoint_dir is not None:
        args.resume = True
    if args.steps < 1:
        raise InputError(f"--steps must be at least 1, got {args.steps}", "", "--steps")
    if args.checkpoint_interval < 0 or args.log_every < 1:
        raise InputError("--checkpoint-interval must be >= 0 and --log-every >= 1", "", "arguments")
    if args.resume and args.checkpoint_dir is None:
        raise InputError("--resume needs --checkpoint-dir", "pass the directory the first run saved to", "--resume")
    plan = _plan(args, world_size)
    check_supported(plan.model)
    check_trainer_loss(plan, "--plan")
    check_trainer_optimizer(plan, "--plan")
    if plan.knobs.compile:
        check_compiler_toolchain()
    if args.tensorboard is not None and os.environ.get("RANK", "0") == "0":  # only rank 0 writes events
        check_tensorboard()
    # Without rendered files, render them here with a schedule that fits --steps.
    options = TrainingOptions(warmup_steps=max(1, args.steps // 10), total_steps=args.steps)
    fsdp: Mapping[str, Any] | None = None
    ds: dict[str, Any] | None = None
    if args.backend == "fsdp":
        if args.deepspeed_config is not None:
            raise InputError("--deepspeed-config is for --backend deepspeed", "", "--deepspeed-config")
        fsdp = _read_fsdp(args.fsdp_config) if args.fsdp_config else render_fsdp(plan, options).config
        _check_fsdp(fsdp, world_size, str(args.fsdp_config or "rendered fsdp config"))
    else:
        if args.fsdp_config is not None:
            raise InputError("--fsdp-config is for --backend fsdp", "", "--fsdp-config")
        ds = _read_json(args.deepspeed_config) if args.deepspeed_config else render_deepspeed(plan, options).config
        _check_deepspeed(ds, world_size, str(args.deepspeed_config or "rendered deepspeed config"))
        check_deepspeed_ac(plan.knobs.activation_checkpointing, ds, str(args.plan or "the plan"))
    seed = args.seed
    if seed is None:
        seed = int(fsdp.get("seed", TrainingOptions.seed)) if fsdp is not None else TrainingOptions.seed
    return TrainSettings(
        plan=plan,
        backend=args.backend,
        fsdp=fsdp,
        deepspeed=ds,
        steps=args.steps,
        seed=seed,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_interval=args.checkpoint_interval,
        resume=args.resume,
        summary_json=args.summary_json,
        log_every=args.log_every,
        metrics_dir=_metrics_dir(args.metrics_dir),
        tensorboard_dir=args.tensorboard,
        restart=restart,
        grace_s=grace_s,
    )


def _metrics_dir(given: Path | None) -> Path | None:
    """--metrics-dir, else the metrics folder of the run directory fstrain's watchdog names."""
    if given is not None:
        return given
    run_dir = os.environ.get("FSTRAIN_RUN_DIR")
    return Path(run_dir) / METRICS_FOLDER if run_dir else None


def _whole(env: Mapping[str, str], name: str, what: str, default: int) -> int:
    text = env.get(name, "").strip()
    if not text:
        return default
    if not (text.isascii() and text.isdigit()) or len(text) > 9:
        raise InputError(f"{name} must be a whole number ({what}), got {text[:20]!r}", f"unset {name} or fix it",
                         name)
    return int(text)


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1e6:
        raise InputError(f"{name} must be a number of seconds, got {text[:20]!r}", f"unset {name} or fix it", name)
    return value


def _plan(args: argparse.Namespace, world_size: int) -> PlanFile:
    if args.plan is not None:
        from fstrain.io.render_files import read_plan_file

        plan = read_plan_file(args.plan)
        if plan.knobs.tp > 1 or plan.knobs.pp > 1:
            raise ConfigError(
                f"the plan uses tp={plan.knobs.tp} pp={plan.knobs.pp}",
                "the reference trainer is data-parallel only; plan with --tp 1 --pp 1",
                str(args.plan),
            )
        from fstrain.core.job.plan import (
            check_trainer_cp,
            check_trainer_ep,
            check_trainer_fp8,
        )

        check_trainer_ep(plan, str(args.plan))
        check_trainer_cp(plan, str(args.plan))
        check_trainer_fp8(plan, str(args.plan))
        return plan
    # No plan: the recipe's model and training defaults, data-parallel over this world.
    from fstrain.core.plan.schema import ClusterSummary
    from fstrain.io.recipes import load_model, load_recipe_file

    recipe = load_recipe_file(str(args.recipe)) if args.recipe else load_model(args.model or "tiny")
    training = recipe.training
    strategy = "zero3" if args.backend == "deepspeed" else "fsdp-full"
    knobs = PlanKnobs(
        strategy=strategy,
        zero_stage=3,
        dp=world_size,
        tp=1,
        pp=1,
        shard_group_size=world_size,
        micro_batch_size=training.micro_batch_size or 1,
        grad_accum_steps=1,
        precision=training.precision or "fp32",
        optimizer=training.optimizer or "adamw",
        activation_checkpointing=training.activation_checkpointing or "none",
    )
    cluster = ClusterSummary(num_nodes=1, gpus_per_node=world_size, gpu="unknown", gpu_memory_bytes=0)
    return PlanFile(model=recipe.model, knobs=knobs, cluster=cluster)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError("file not found", "render one with `fstrain render`", str(path)) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON: {exc.msg}", "", f"{path}:{exc.lineno}") from None
    if not isinstance(data, dict):
        raise InputError("expected a JSON object", "", str(path))
    return data


def _read_fsdp(path: Path) -> Mapping[str, Any]:
    from fstrain.io.userfiles import load_yaml, read_text_bounded

    data = load_yaml(read_text_bounded(path, "FSDP file", hint="render one with `fstrain render`"), str(path))
    if not isinstance(data, Mapping) or data.get("fstrain_fsdp") != FSDP_FILE_VERSION:
        raise InputError(
            f"not an fstrain FSDP file (expected 'fstrain_fsdp: {FSDP_FILE_VERSION}')",
            "render one with `fstrain render`",
            str(path),
        )
    return data


def _check_fsdp(fsdp: Mapping[str, Any], world_size: int, where: str) -> None:
    try:
        shape = [int(n) for n in fsdp["mesh"]["shape"]]
        names = list(fsdp["mesh"]["dim_names"])
        batch = fsdp["batch"]
        int(batch["micro_batch_size"]), int(batch["grad_accum_steps"])
        param_dtype = fsdp["mixed_precision"]["param_dtype"]
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"missing or malformed key {exc}", "re-render the file with `fstrain render`", where) from None
    if names not in (["shard"], ["replicate", "shard"]) or len(shape) != len(names):
        raise InputError(f"mesh {names} {shape}", "expected dim_names [shard] or [replicate, shard]", where)
    product = 1
    for n in shape:
        product *= n
    if product != world_size:
        raise ConfigError(
            f"mesh {' x '.join(map(str, shape))} = {product} ranks, but WORLD_SIZE is {world_size}",
            "launch as many processes as the plan's dp, or re-plan for this world size",
            where,
        )
    if param_dtype not in _PRECISION_OF_DTYPE:
        raise InputError(f"mixed_precision.param_dtype {param_dtype!r}", "use bfloat16, float16 or float32", where)
    if fsdp.get("model_dtype", "float32") not in ("float32", "bfloat16"):
        raise InputError(f"model_dtype {fsdp.get('model_dtype')!r}", "use float32, or bfloat16 for pure bf16", where)
    if fsdp.get("autocast") not in (None, "bfloat16", "float16"):
        raise InputError(f"autocast {fsdp.get('autocast')!r}", "use bfloat16, float16 or null", where)
    parse_ac(fsdp.get("activation_checkpointing", "none"), f"{where}: activation_checkpointing")


def _check_deepspeed(ds: Mapping[str, Any], world_size: int, where: str) -> None:
    try:
        total = int(ds["train_batch_size"])
        micro = int(ds["train_micro_batch_size_per_gpu"])
        accum = int(ds["gradient_accumulation_steps"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"missing or malformed key {exc}", "re-render the file with `fstrain render`", where) from None
    if total != micro * accum * world_size:
        raise ConfigError(
            f"train_batch_size({total}) != micro({micro}) x accumulation({accum}) x world({world_size})",
            "launch as many processes as the plan's dp, or re-render for this world size",
            where,
        )


def check_deepspeed_ac(ac: str, ds: Mapping[str, Any], where: str) -> None:
    """Op-level selective checkpointing replays the block's ops exactly; ZeRO-3 gathers parameters
    inside the block at forward and at recompute in different ways, so torch refuses the replay
    (``aten.cat.out encountered during backward but not found in storage``)."""
    stage = int(ds.get("zero_optimization", {}).get("stage", 0))
    if ac == "selective-op" and stage == 3:
        raise ConfigError(
            "activation checkpointing selective-op does not run under DeepSpeed ZeRO-3",
            "use full, every-k:N or megatron-selective with ZeRO-3, or an FSDP strategy for selective-op",
            where,
        )


def fsdp_precision(fsdp: Mapping[str, Any]) -> str:
    """The plan's precision mode (fstrain.core.plan.precision) the FSDP file describes."""
    autocast = fsdp.get("autocast")
    if autocast:
        return "amp-" + _PRECISION_OF_DTYPE[str(autocast)]
    if fsdp.get("model_dtype") == "bfloat16":
        return "bf16-pure"
    return _PRECISION_OF_DTYPE[str(fsdp["mixed_precision"]["param_dtype"])]


def fsdp_training_options(fsdp: Mapping[str, Any]) -> TrainingOptions:
    """The optimizer and schedule settings the FSDP file carries."""
    opt = fsdp.get("optimizer", {})
    sched = fsdp.get("scheduler", {})
    defaults = TrainingOptions()
    betas = opt.get("betas", defaults.betas)
    return TrainingOptions(
        lr=float(opt.get("lr", defaults.lr)),
        weight_decay=float(opt.get("weight_decay", defaults.weight_decay)),
        betas=(float(betas[0]), float(betas[1])),
        eps=float(opt.get("eps", defaults.eps)),
        momentum=float(opt.get("momentum", defaults.momentum)),
        warmup_steps=int(sched.get("warmup_steps", defaults.warmup_steps)),
        total_steps=int(sched.get("total_steps", defaults.total_steps)),
        min_lr_ratio=float(sched.get("min_lr_ratio", defaults.min_lr_ratio)),
        gradient_clipping=float(fsdp.get("gradient_clipping", defaults.gradient_clipping)),
        seed=int(fsdp.get("seed", defaults.seed)),
    )
