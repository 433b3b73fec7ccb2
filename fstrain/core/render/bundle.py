"""Everything ``fstrain render`` writes, as values: the configs, the env and the README, and the
configs of the trainers asked for with ``--trainer`` (:mod:`fstrain.core.render.trainers`).

The writer (``fstrain.io.render_files``) only serializes and writes what this returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fstrain.core.plan.planfile import PlanFile
from fstrain.core.render.deepspeed import render_deepspeed
from fstrain.core.render.env import EnvVar, render_env
from fstrain.core.render.fsdp import render_accelerate, render_fsdp
from fstrain.core.render.hftrainer import render_hf_trainer
from fstrain.core.render.lightning import render_lightning
from fstrain.core.render.options import TrainingOptions
from fstrain.core.render.torchtitan import format_torchtitan_args, render_torchtitan
from fstrain.core.render.trainers import check_trainers
from fstrain.errors import ConfigError

DS_CONFIG = "ds_config.json"
FSDP_CONFIG = "fsdp.yaml"
ACCELERATE_CONFIG = "accelerate.yaml"
ENV_FILE = "fstrain.env"
README = "README"
PLAN_FILE = "plan.yaml"
HF_ARGS = "hf_training_args.json"
HF_DS_CONFIG = "hf_ds_config.json"
LIGHTNING_CONFIG = "lightning.yaml"
TORCHTITAN_ARGS = "torchtitan.args"
# What each trainer's file is, for the README (docs/configs.md shows the lines that load them).
TRAINER_FILES = {
    HF_ARGS: "Hugging Face TrainingArguments: HfArgumentParser(TrainingArguments).parse_json_file(...)",
    HF_DS_CONFIG: "the DeepSpeed config hf_training_args.json names ('auto' where the Trainer fills it)",
    LIGHTNING_CONFIG: "Lightning Trainer and strategy arguments (YAML; see docs/configs.md)",
    TORCHTITAN_ARGS: "torchtitan's overrides: -m torchtitan.train --module M --config F $(cat torchtitan.args)",
}
RENDERED_FILES = (ACCELERATE_CONFIG, DS_CONFIG, ENV_FILE, FSDP_CONFIG, HF_ARGS, HF_DS_CONFIG, LIGHTNING_CONFIG,
                  PLAN_FILE, README, TORCHTITAN_ARGS)


@dataclass(frozen=True)
class RenderBundle:
    deepspeed: dict[str, object] | None  # None: DeepSpeed cannot run the plan (context parallelism)
    fsdp: dict[str, object]
    accelerate: dict[str, object]
    env: tuple[EnvVar, ...]
    readme: str
    plan: dict[str, object]
    notes: dict[str, tuple[str, ...]]  # rendered file name -> what a human should know
    topo_files: tuple[str, ...]  # file names of the NCCL XML copies in the output directory
    # The trainers' files, for those asked for (None: not asked for, or no such file for the plan)
    hf_training_args: dict[str, object] | None = None
    hf_deepspeed: dict[str, object] | None = None
    lightning: dict[str, object] | None = None
    torchtitan_args: tuple[str, ...] | None = None


def render_bundle(
    plan: PlanFile,
    *,
    out_dir: str,
    options: TrainingOptions | None = None,
    ifname: str | None = None,
    rdma_devices: Sequence[str] = (),
    topo_files: Sequence[str] = (),
    debug: bool = False,
    trainers: Sequence[str] = (),
) -> RenderBundle:
    """Render every file for ``plan``; ``out_dir`` is the absolute directory they will live in.
    ``trainers`` (names of :data:`fstrain.core.render.trainers.TRAINERS`) adds their files; a plan
    one of them cannot run is refused before anything is rendered."""
    trainers = check_trainers(trainers)
    names = set(topo_files)
    clashes = names & set(RENDERED_FILES)
    if len(names) != len(topo_files) or clashes:
        raise ConfigError(
            f"NCCL topology file names must be distinct and not clash with the rendered files, got {list(topo_files)}",
            "rename the XML files",
            "topology",
        )
    # DeepSpeed has no ring-attention context parallelism: a cp > 1 plan gets no ds_config.json.
    ds = render_deepspeed(plan, options, debug=debug) if plan.knobs.cp == 1 else None
    fsdp = render_fsdp(plan, options)
    accelerate = render_accelerate(plan)
    # One XML means one machine shape: every node can point NCCL at it. With several, each
    # node needs its own, which the launcher sets per host.
    topo_path = f"{out_dir.rstrip('/')}/{topo_files[0]}" if len(topo_files) == 1 else None
    env = render_env(ifname=ifname, rdma_devices=rdma_devices, nccl_topo_file=topo_path, debug=debug)
    ds_notes = ds.notes if ds is not None else (
        f"not written: the plan has cp={plan.knobs.cp}, and DeepSpeed has no ring-attention context parallelism "
        "(DeepSpeed-Ulysses is a different scheme); re-plan with --cp 1 for DeepSpeed",)
    notes = {DS_CONFIG: ds_notes, FSDP_CONFIG: fsdp.notes, ACCELERATE_CONFIG: accelerate.notes}
    trainer_configs, trainer_notes = render_trainers(plan, trainers, out_dir=out_dir, options=options, debug=debug)
    notes.update(trainer_notes)
    readme = render_readme(
        plan,
        notes=notes,
        env=env,
        topo_files=tuple(topo_files),
    )
    return RenderBundle(
        deepspeed=ds.config if ds is not None else None,
        fsdp=fsdp.config,
        accelerate=accelerate.config,
        env=env,
        readme=readme,
        plan=plan.to_dict(),
        notes=notes,
        topo_files=tuple(topo_files),
        **trainer_configs,
    )


def render_trainers(
    plan: PlanFile, trainers: Sequence[str], *, out_dir: str, options: TrainingOptions | None, debug: bool
) -> tuple[dict[str, Any], dict[str, tuple[str, ...]]]:
    """The trainers' configs as RenderBundle fields, and their notes by file name."""
    configs: dict[str, Any] = {}
    notes: dict[str, tuple[str, ...]] = {}
    if "hf-trainer" in trainers:
        hf = render_hf_trainer(plan, options, deepspeed_path=f"{out_dir.rstrip('/')}/{HF_DS_CONFIG}", debug=debug)
        configs["hf_training_args"], notes[HF_ARGS] = hf.arguments.config, hf.arguments.notes
        if hf.deepspeed is not None:
            configs["hf_deepspeed"], notes[HF_DS_CONFIG] = hf.deepspeed.config, hf.deepspeed.notes
    if "lightning" in trainers:
        lightning = render_lightning(plan, options, debug=debug)
        configs["lightning"], notes[LIGHTNING_CONFIG] = lightning.config, lightning.notes
    if "torchtitan" in trainers:
        torchtitan = render_torchtitan(plan, options)
        configs["torchtitan_args"] = format_torchtitan_args(torchtitan.config)
        notes[TORCHTITAN_ARGS] = torchtitan.notes
    return configs, notes


def render_readme(
    plan: PlanFile,
    *,
    notes: dict[str, tuple[str, ...]],
    env: Sequence[EnvVar],
    topo_files: tuple[str, ...],
) -> str:
    knobs = plan.knobs
    model = plan.model
    primary = "fsdp.yaml" if knobs.strategy.startswith("fsdp") or knobs.strategy == "ddp" else "ds_config.json"
    nproc = max(1, plan.cluster.gpus_per_node)
    lines = [
        "Rendered by `fstrain render`: the files a training job reads for this plan.",
        "",
        f"Plan: {model.name} ({model.num_layers} layers, hidden {model.hidden_size}, seq {model.seq_len}), "
        f"strategy {knobs.strategy}, ZeRO stage {knobs.zero_stage}, dp={knobs.dp} tp={knobs.tp} pp={knobs.pp}"
        f"{f' ep={knobs.ep}' if knobs.ep > 1 else ''}{f' cp={knobs.cp}' if knobs.cp > 1 else ''}, "
        f"shard group {knobs.shard_group_size}",
        f"Batch: micro-batch {knobs.micro_batch_size} x grad-accum {knobs.grad_accum_steps} x dp {knobs.dp} "
        f"= {knobs.global_batch_size} sequences per step; precision {knobs.precision}"
        f"{' with fp8 linears' if knobs.fp8 else ''}; "
        f"activation checkpointing {knobs.activation_checkpointing}; offload {knobs.offload}",
        f"Cluster: {plan.cluster.num_nodes} node(s) x {plan.cluster.gpus_per_node} {plan.cluster.gpu}",
        f"The plan's strategy is {knobs.strategy}: {primary} is the primary file; the other backend's file "
        "holds the closest equivalent.",
        "",
        "Files",
        "-----",
        "ds_config.json   DeepSpeed config: deepspeed.initialize(model=..., config='ds_config.json')",
        "fsdp.yaml        FSDP2 layout for the bundled trainer (fully_shard mesh, reshard, mixed precision, offload)",
        "accelerate.yaml  Accelerate config (FSDP version 2): accelerate launch --config_file accelerate.yaml",
        "fstrain.env      Environment variables, one reason per variable",
        "plan.yaml        The plan these files were rendered from (the trainer reads the model from it)",
    ]
    for name in topo_files:
        lines.append(f"{name:<16} NCCL topology XML (NCCL_TOPO_FILE)")
    trainer_files = [name for name in TRAINER_FILES if name in notes]
    if trainer_files:
        lines += ["", "Files for your trainer (--trainer)", "----------------------------------"]
        lines += [f"{name:<22} {TRAINER_FILES[name]}" for name in trainer_files]
    lines += [
        "",
        "Run the bundled trainer (one node shown; `fstrain launch --plan plan.yaml` starts every node)",
        "--------------------------------------------------------------------------------------------",
        "set -a; . ./fstrain.env; set +a",
        f"torchrun --nproc-per-node {nproc} -m fstrain.train --backend fsdp --fsdp-config fsdp.yaml --plan plan.yaml",
        f"deepspeed --num_gpus {nproc} --module fstrain.train --backend deepspeed --deepspeed-config ds_config.json "
        "--plan plan.yaml",
        "",
        f"fstrain.env sets {', '.join(var.name for var in env)}.",
    ]
    if len(topo_files) > 1:
        lines.append("NCCL_TOPO_FILE is not set here: each node shape has its own XML; point each node at its file.")
    lines += ["", "Notes", "-----"]
    for file_name in sorted(notes):
        lines += [f"{file_name}: {note}" for note in notes[file_name]]
    return "\n".join(lines) + "\n"
