"""``fstrain plan``: a dry run from a model and a cluster to ranked, explained sharding plans.

Exit codes: 0 a plan fits; 1 nothing fits (the closest configurations and what would fit are
shown); 2 bad input (one line on stderr).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from fstrain.cli import hostopts

if TYPE_CHECKING:
    from fstrain.core.plan.assumptions import Assumptions
    from fstrain.core.plan.plancluster import NodeGpus, PlanCluster
    from fstrain.core.plan.planner import Pins, PlanModel, PlanResult, TrainingSpec
    from fstrain.core.plan.recipe import Recipe

DEFAULT_BATCH_TOKENS = 4 * 1024 * 1024  # Llama 2 / GPT-3 scale: 4M tokens per optimizer step


def register(app: typer.Typer) -> None:
    app.command("plan", help="Plan sharding, memory and throughput for a model on a cluster (a dry run).")(plan_command)


def plan_command(
    model: str | None = typer.Option(None, "--model", "-m", help="A shipped recipe: tiny, llama3.1-8b, ..."),
    recipe: str | None = typer.Option(None, "--recipe", help="Your own recipe YAML file."),
    model_params: str | None = typer.Option(
        None, "--model-params", help="Only a parameter count (7e9, 70B): model states, no activations or speed."
    ),
    num_nodes: int | None = typer.Option(None, "--num-nodes", min=1, help="Nodes (default 1)."),
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", min=1, help="GPUs per node (default 8)."),
    gpu: str | None = typer.Option(None, "--gpu", help="GPU type: h100-sxm, a100-80gb, ... or an NVML name."),
    node: list[str] | None = typer.Option(
        None, "--node", help="A kind of node, GPU:COUNT[xNODES], repeatable: --node a100-40gb:8x2 --node h100-sxm:8x2."
    ),
    gpu_memory: float | None = typer.Option(
        None, "--gpu-memory", min=0.001, metavar="GIB",
        help="GPU memory in GiB (replaces the table's; with --gpu-tflops, any GPU)."
    ),
    gpu_tflops: float | None = typer.Option(
        None, "--gpu-tflops", min=0.001, metavar="TFLOPS",
        help="Dense bf16/fp16 peak per GPU in TFLOP/s (replaces the table's)."
    ),
    nvlink_domain_size: int | None = typer.Option(
        None, "--nvlink-domain-size", min=1, help="GPUs per NVLink domain (default from the GPU table)."
    ),
    inter_node_gbps: float | None = typer.Option(
        None, "--inter-node-gbps", min=0.001, help="Scale-out bandwidth per node, Gb/s, all NICs together."
    ),
    global_batch: int | None = typer.Option(None, "--global-batch", min=1, help="Sequences per optimizer step."),
    global_batch_tokens: int | None = typer.Option(None, "--global-batch-tokens", min=1, help="Tokens per step."),
    micro_batch: int | None = typer.Option(None, "--micro-batch", min=1, help="Pin the micro-batch size."),
    grad_accum: int | None = typer.Option(None, "--grad-accum", min=1, help="Pin gradient-accumulation steps."),
    seq_len: int | None = typer.Option(None, "--seq-len", min=1, help="Sequence length (default: the recipe's)."),
    precision: str | None = typer.Option(
        None, "--precision", help="bf16, fp16 (loss scaling), fp32, bf16-pure (no fp32 master: torchtune), "
        "amp-bf16 or amp-fp16 (torch.autocast over fp32 weights)."),
    optimizer: str | None = typer.Option(
        None, "--optimizer",
        help="adamw, sgd (momentum), adam8bit or adafactor (Hugging Face's, as the Trainer's optim='adafactor' "
        "runs it: factored fp32 second moment, no first moment; ddp and zero1/2/3 only)."),
    ac: str | None = typer.Option(
        None,
        "--ac",
        help="Pin activation checkpointing: none, selective-op (torchtitan op-level), every-k:N (every N-th "
        "block), full, megatron-selective (alias: selective).",
    ),
    flash_attention: bool | None = typer.Option(
        None, "--flash-attention/--no-flash-attention", help="FlashAttention (default on, off for fp32)."
    ),
    loss: str = typer.Option(
        "full", "--loss",
        help="How the training code computes the loss, which sets the logits' memory: full (cross-entropy on "
        "an fp32 copy: the bundled trainer, torchtitan, Hugging Face), fused (a fused kernel on the "
        "compute-dtype logits, e.g. flash-attn's: llm-foundry's default), megatron (Megatron-LM's "
        "vocab-parallel cross-entropy as DeepSpeed's Megatron-LM examples run it), megatron-core "
        "(Megatron-LM core's, as ATorch's fork runs it) or chunked[:N] "
        "(torchtune's CEWithChunkedOutputLoss, N chunks of tokens, default 8; the bundled trainer runs it too), "
        "or none (no vocabulary head: a classification or regression head, e.g. BERT fine-tuning; the recipe's "
        "pooler and num_labels describe it).",
    ),
    compile_blocks: bool = typer.Option(
        False, "--compile/--no-compile",
        help="The training code runs torch.compile on each block (torchtitan --training.compile): fused "
        "elementwise ops keep fewer activations and move fewer bytes.",
    ),
    fused_rmsnorm: bool = typer.Option(
        False, "--fused-rmsnorm",
        help="An eager model whose RMSNorm is one fused kernel (torchtitan's norm_type fused_rmsnorm): it keeps "
        "its input, not an fp32 copy.",
    ),
    fp8: bool = typer.Option(
        False, "--fp8",
        help="The blocks' linear layers compute in fp8 (torchao Float8Linear with tensorwise scaling, as "
        "torchtitan's `--model.converters float8` runs it, or Transformer Engine's Linear); attention, norms "
        "and the output layer stay bf16. Needs fp8 tensor cores (H100, H200, B200, L40S, MI300X...). "
        "Not run by the bundled trainer.",
    ),
    fp8_all_gather: bool = typer.Option(
        False, "--fp8-all-gather",
        help="With --fp8: FSDP gathers the fp8 linears' weights in fp8 (torchao enable_fsdp_float8_all_gather, "
        "torchtitan --float8.enable_fsdp_float8_all_gather); plans fsdp-* strategies only.",
    ),
    strategy: str | None = typer.Option(
        None, "--strategy", help="Pin: ddp, zero1, zero2, zero3, fsdp-full, fsdp-grad-op, fsdp-hybrid (no-shard = ddp)."
    ),
    zero_stage: int | None = typer.Option(None, "--zero-stage", min=0, max=3, help="Shorthand: N means zeroN, 0 ddp."),
    tp: int | None = typer.Option(None, "--tp", min=1, help="Pin the tensor-parallel degree."),
    pp: int | None = typer.Option(None, "--pp", min=1, help="Pin the pipeline-parallel degree."),
    shard_group_size: int | None = typer.Option(None, "--shard-group-size", min=1, help="Pin the fsdp-hybrid group."),
    pp_schedule: str | None = typer.Option(
        None, "--pp-schedule",
        help="Pin the pipeline schedule: 1f1b, interleaved (interleaved 1F1B, with --pp-virtual-stages) or "
        "zero-bubble (ZB-H1). Default with --pp > 1: zero-bubble where torch runs the pipeline (ddp, fsdp-*), "
        "1f1b on DeepSpeed (zero1).",
    ),
    pp_virtual_stages: int | None = typer.Option(
        None, "--pp-virtual-stages",
        help="Model chunks per pipeline rank for --pp-schedule interleaved (default 2).",
    ),
    ep: int | None = typer.Option(
        None, "--ep",
        help="Pin the expert-parallel degree (mixture-of-experts models): each rank holds num_experts/EP experts. "
        "Default: searched over the divisors of the experts that divide the data-parallel degree.",
    ),
    cp: int | None = typer.Option(
        None, "--cp", min=1,
        help="Context-parallel degree (torchtitan's ring attention): each sequence is split over CP GPUs, "
        "dp x cp x tp x pp = GPUs; needs an fsdp-* strategy, --pp 1 and a sequence divisible by 2 x CP. "
        "Default 1 (never searched).",
    ),
    offload: str | None = typer.Option(None, "--offload", help="Pin CPU offload: none, optimizer, optimizer+params."),
    train_tokens: str | None = typer.Option(None, "--train-tokens", help="Token budget for time to train (2e12, 15T)."),
    mfu: float | None = typer.Option(None, "--mfu", min=0.01, max=1.0, help="Achievable MFU (default per GPU type)."),
    assume: list[str] | None = typer.Option(None, "--assume", help="Override an assumption: KEY=VALUE, repeatable."),
    calibrate: str | None = typer.Option(None, "--calibrate", metavar="FILE",
                                         help="Measured numbers in place of assumptions: a bench JSON "
                                         "(fstrain bench --out) or the trainer's summary.json."),
    top: int = typer.Option(5, "--top", min=1, help="How many plans to show."),
    json_output: bool = typer.Option(False, "--json", help="Print one JSON document on stdout."),
    trace: bool = typer.Option(
        False, "--trace", help="Also trace the chosen plan's memory with PyTorch on fake tensors (needs torch; CPU)."
    ),
    out: str | None = typer.Option(None, "--out", help="Save the best plan as YAML for render and launch."),
    render_dir: str | None = typer.Option(None, "--render", help="Also render the best plan's configs into DIR."),
    force: bool = typer.Option(False, "--force", help="With --render: replace rendered files in a non-empty DIR."),
    hostfile: str | None = hostopts.HOSTFILE,
    hosts: str | None = hostopts.HOSTS,
    include: str | None = hostopts.INCLUDE,
    exclude: str | None = hostopts.EXCLUDE,
    ssh_config: str | None = hostopts.SSH_CONFIG,
    accept_new_hosts: bool = hostopts.ACCEPT_NEW,
    fanout: int = hostopts.FANOUT,
    python: str = typer.Option("python3", "--python", help="With --hostfile/--hosts: the probe's interpreter."),
) -> None:
    """Rank the configurations that fit by predicted throughput and explain the ones that do not."""
    from fstrain.core.plan.assumptions import Assumptions, with_overrides
    from fstrain.core.plan.planner import plan

    plan_model, recipe_value = resolve_model(model, recipe, model_params)
    if (out or render_dir) and plan_model.spec is None:
        from fstrain.errors import InputError

        flag = "--out" if out else "--render"
        raise InputError("a plan file needs the model architecture", f"use --model or --recipe with {flag}", flag)
    if render_dir:
        from pathlib import Path

        from fstrain.io.render_files import check_out_dir

        check_out_dir(Path(render_dir), force=force)  # before any work: nothing is half-written
    probed = probe_cluster(hostfile, hosts, include, exclude, ssh_config, accept_new_hosts, fanout, python)
    if probed is None:  # inside a Slurm allocation, the allocation is the cluster
        from fstrain.cli.slurm import plan_allocation

        num_nodes, gpus_per_node, probed = plan_allocation(num_nodes, gpus_per_node, gpu, node, python, fanout)
    training, batch_note = resolve_training(
        plan_model,
        recipe_value,
        seq_len,
        global_batch,
        global_batch_tokens,
        micro_batch,
        grad_accum,
        precision,
        optimizer,
        flash_attention,
        train_tokens,
        loss,
        compile_blocks,
        fused_rmsnorm,
        fp8,
        fp8_all_gather,
    )
    plan_model = plan_model.for_loss(training.loss)  # --loss none: no vocabulary head
    pins = resolve_pins(strategy, zero_stage, tp, pp, shard_group_size, micro_batch, grad_accum, ac, offload,
                        pp_schedule, pp_virtual_stages, ep, cp)
    cluster = resolve_cluster(num_nodes, gpus_per_node, gpu, node, nvlink_domain_size, inter_node_gbps, probed,
                              gpu_memory, gpu_tflops)
    base = Assumptions()
    calibration = None
    if calibrate:  # measured numbers first; explicit --assume, --mfu and --inter-node-gbps still win
        from fstrain.cli.plan_calibrate import calibrated

        calibration = calibrated(calibrate, base, cluster, training.precision, plan_model.spec,
                                 inter_node_gbps, list(assume or []), mfu, json_output)
        base, cluster = calibration.assumptions, calibration.cluster
    assumptions = with_overrides(base, list(assume or []))
    if mfu is not None:
        assumptions = with_overrides(assumptions, [f"mfu={mfu}"], "--mfu")
    result = plan(plan_model, training, cluster, pins, assumptions)
    if out and result.plans:  # nothing fits: the output says what would, and no file is written
        write_plan_file(out, result, plan_model, cluster, training.train_tokens)
    if render_dir and result.plans:
        from fstrain.core.plan.planner import plan_file
        from fstrain.io.render_files import render_and_write

        _, written = render_and_write(plan_file(result, plan_model, cluster, training.train_tokens), render_dir,
                                      force=force)
        if not json_output:
            from fstrain.cli.output import console

            console().print(f"rendered {len(written)} files into {render_dir}")
    traced: dict[str, Any] | None = None
    if trace:
        from fstrain.cli.plan_trace import run_trace

        traced = run_trace(result, plan_model, cluster)
    if json_output:
        from fstrain.cli.output import print_json

        document = plan_document(result, plan_model, training, cluster, assumptions, top, batch_note)
        if calibration is not None:
            from fstrain.cli.plan_calibrate import calibration_document

            document["calibration"] = calibration_document(calibrate or "", calibration)
        print_json({**document, "trace": traced} if trace else document)
    else:
        from fstrain.cli.plan_output import print_plans

        print_plans(result, plan_model, training, cluster, assumptions, top, batch_note, out)
        if traced is not None:
            from fstrain.cli.plan_trace import print_trace

            print_trace(traced)
    raise typer.Exit(0 if result.plans else 1)


def probe_cluster(hostfile: str | None, hosts: str | None, include: str | None, exclude: str | None,
                  ssh_config: str | None, accept_new_hosts: bool, fanout: int, python: str) -> list[NodeGpus] | None:
    """With --hostfile/--hosts: probe every host and describe its GPUs; otherwise None."""
    if not hostfile and not hosts:
        return None
    from fstrain.core.plan.plancluster import node_gpus_from_report
    from fstrain.errors import TransportError
    from fstrain.io.connect import make_connector
    from fstrain.io.probe import probe_inventory

    selection = hostopts.resolve_hosts(hostfile, hosts, include, exclude, None)
    reports, failed = probe_inventory(selection.hosts, make_connector(ssh_config, accept_new_hosts=accept_new_hosts),
                                      python=python, fanout=fanout)
    if failed:
        raise TransportError("could not probe " + "; ".join(error.one_line() for _, error in failed),
                             "fix or --exclude those hosts, or describe the cluster with --gpu", "fstrain plan")
    return [node_gpus_from_report(r, h.label()) for h, r in zip(selection.hosts, reports, strict=True)]


def resolve_model(model: str | None, recipe: str | None, model_params: str | None) -> tuple[PlanModel, Recipe | None]:
    """Exactly one of --model, --recipe, --model-params."""
    from fstrain.core.plan.planner import PlanModel
    from fstrain.core.plan.recipe import parse_count
    from fstrain.errors import InputError

    given = [
        flag for flag, value in (("--model", model), ("--recipe", recipe), ("--model-params", model_params)) if value
    ]
    if len(given) != 1:
        raise InputError(
            "give exactly one of --model, --recipe and --model-params"
            + (f" (got {', '.join(given)})" if given else ""),
            "e.g. --model llama3.1-8b",
            "fstrain plan",
        )
    if model_params:
        return PlanModel(parse_count(model_params, "--model-params")), None
    from fstrain.io.recipes import load_recipe_file, load_shipped_recipe

    loaded = load_shipped_recipe(model) if model else load_recipe_file(str(recipe))
    return PlanModel.from_spec(loaded.model), loaded


def resolve_training(
    plan_model: PlanModel,
    recipe: Recipe | None,
    seq_len: int | None,
    global_batch: int | None,
    global_batch_tokens: int | None,
    micro_batch: int | None,
    grad_accum: int | None,
    precision: str | None,
    optimizer: str | None,
    flash_attention: bool | None,
    train_tokens: str | None,
    loss: str = "full",
    compiled: bool = False,
    fused_rmsnorm: bool = False,
    fp8: bool = False,
    fp8_all_gather: bool = False,
) -> tuple[TrainingSpec, str]:
    """Flags first, then the recipe's training defaults, then fstrain's; the note says which."""
    from fstrain.core.plan.losses import parse_loss
    from fstrain.core.plan.planner import TrainingSpec
    from fstrain.core.plan.precision import PRECISIONS
    from fstrain.core.plan.recipe import TrainingDefaults, parse_count
    from fstrain.core.plan.schema import OPTIMIZERS
    from fstrain.errors import InputError

    defaults = recipe.training if recipe else TrainingDefaults()
    seq = seq_len or (plan_model.spec.seq_len if plan_model.spec else 0)
    chosen_precision = _choice(precision or defaults.precision or "bf16", PRECISIONS, "--precision")
    chosen_optimizer = _choice(optimizer or defaults.optimizer or "adamw", OPTIMIZERS, "--optimizer")
    flash = flash_attention
    if flash is None:  # FlashAttention has no fp32 kernels: fp32 turns the recipe's default off
        recipe_flash = defaults.flash_attention if defaults.flash_attention is not None else True
        flash = recipe_flash and chosen_precision != "fp32"
    if global_batch and global_batch_tokens:
        raise InputError("--global-batch and --global-batch-tokens both given", "give the batch once", "--global-batch")
    batch: int | None
    if global_batch or global_batch_tokens:
        batch, note = global_batch, "--global-batch"
        if global_batch_tokens:
            batch, note = _sequences(global_batch_tokens, seq, "--global-batch-tokens"), "--global-batch-tokens"
    elif defaults.global_batch_size or defaults.global_batch_tokens:
        batch = defaults.global_batch_size or _sequences(defaults.global_batch_tokens or 0, seq, "recipe")
        note = "the recipe"
    elif micro_batch and grad_accum:
        batch, note = None, "--micro-batch x --grad-accum x dp"
    else:
        batch = max(1, DEFAULT_BATCH_TOKENS // seq) if seq else 1
        note = "fstrain's default of 4M tokens (set --global-batch)"
    budget = parse_count(train_tokens, "--train-tokens") if train_tokens else defaults.train_tokens
    chosen_loss = parse_loss(loss, "--loss")
    if fused_rmsnorm and plan_model.spec is not None and plan_model.spec.norm != "rmsnorm":
        raise InputError(f"{plan_model.spec.name} normalises with {plan_model.spec.norm}, not RMSNorm",
                         "leave --fused-rmsnorm out for this model", "--fused-rmsnorm")
    spec = TrainingSpec(seq, batch, chosen_precision, chosen_optimizer, flash, budget, chosen_loss,
                        compile=compiled, fused_rmsnorm=fused_rmsnorm, fp8=fp8,
                        fp8_all_gather=fp8_all_gather)
    return spec, note


def _sequences(tokens: int, seq: int, where: str) -> int:
    from fstrain.errors import InputError

    if seq <= 0 or tokens % seq or tokens < seq:
        raise InputError(
            f"{tokens} tokens is not a whole number of {seq}-token sequences",
            "give a multiple of the sequence length, or --global-batch in sequences",
            where,
        )
    return tokens // seq


def resolve_pins(
    strategy: str | None,
    zero_stage: int | None,
    tp: int | None,
    pp: int | None,
    shard_group_size: int | None,
    micro_batch: int | None,
    grad_accum: int | None,
    ac: str | None,
    offload: str | None,
    pp_schedule: str | None = None,
    pp_virtual_stages: int | None = None,
    ep: int | None = None,
    cp: int | None = None,
) -> Pins:
    from fstrain.core.plan.acpolicy import parse_ac
    from fstrain.core.plan.planner import Pins
    from fstrain.core.plan.schema import OFFLOAD, STRATEGIES
    from fstrain.errors import InputError

    aliases = {"no-shard": "ddp", "fsdp-no-shard": "ddp", "zero0": "ddp"}
    chosen = aliases.get(strategy, strategy) if strategy else None
    if chosen is not None:
        chosen = _choice(chosen, STRATEGIES, "--strategy")
    if zero_stage is not None:
        from_stage = "ddp" if zero_stage == 0 else f"zero{zero_stage}"
        if chosen is not None and chosen != from_stage:
            raise InputError(
                f"--zero-stage {zero_stage} means {from_stage}, but --strategy is {strategy}",
                "give one of them",
                "--zero-stage",
            )
        chosen = from_stage
    return Pins(
        strategy=chosen,
        tp=tp,
        pp=pp,
        shard_group_size=shard_group_size,
        micro_batch_size=micro_batch,
        grad_accum_steps=grad_accum,
        activation_checkpointing=parse_ac(ac, "--ac") if ac else None,
        offload=_choice(offload, OFFLOAD, "--offload") if offload else None,
        pp_schedule=_pp_schedule(pp_schedule) if pp_schedule is not None else None,
        pp_virtual_stages=pp_virtual_stages,
        ep=ep,
        cp=cp,
    )


def _pp_schedule(value: str) -> str:
    """--pp-schedule, with the names torchtitan and the papers use for the same schedules."""
    from fstrain.core.plan.schema import PP_SCHEDULES
    from fstrain.errors import InputError

    aliases = {"interleaved-1f1b": "interleaved", "interleaved1f1b": "interleaved", "zb-h1": "zero-bubble",
               "zbh1": "zero-bubble", "zero-bubble-h1": "zero-bubble"}
    chosen = aliases.get(value.lower(), value.lower())
    if chosen not in PP_SCHEDULES:
        raise InputError(f"{value!r} is not a pipeline schedule",
                         f"use one of {', '.join(PP_SCHEDULES)} (interleaved takes --pp-virtual-stages V)",
                         "--pp-schedule")
    return chosen


def resolve_cluster(
    num_nodes: int | None,
    gpus_per_node: int | None,
    gpu: str | None,
    node_specs: list[str] | None,
    nvlink_domain_size: int | None,
    inter_node_gbps: float | None,
    probed: list[NodeGpus] | None = None,
    gpu_memory_gib: float | None = None,
    gpu_tflops: float | None = None,
) -> PlanCluster:
    """The cluster from probed nodes (``probed``), ``--node`` kinds, or --num-nodes x --gpus-per-node x --gpu."""
    from fstrain.core.plan.plancluster import NodeGpus, build_cluster
    from fstrain.errors import InputError

    if (gpu_memory_gib or gpu_tflops) and (probed is not None or node_specs or not gpu):
        raise InputError("--gpu-memory and --gpu-tflops describe the --gpu of a uniform cluster",
                         "give --gpu NAME with them (any name, for a GPU outside the table)", "--gpu-memory")
    if probed is not None:
        return build_cluster(probed, inter_node_gbps, "probe")
    if node_specs:
        if gpu or num_nodes or gpus_per_node:
            raise InputError("--node cannot be combined with --gpu, --num-nodes or --gpus-per-node", "", "--node")
        nodes = [n for spec in node_specs for n in _parse_node(spec, nvlink_domain_size)]
        return build_cluster(nodes, inter_node_gbps, "--node")
    if not gpu:
        from fstrain.core.plan.gpus import known_gpu_names

        raise InputError("which GPU? give --gpu", f"one of {', '.join(known_gpu_names())}", "--gpu")
    memory = int(gpu_memory_gib * 2**30) if gpu_memory_gib else None
    node = NodeGpus(gpu, gpus_per_node or 8, memory_bytes=memory, nvlink_domain_size=nvlink_domain_size,
                    peak_tflops=gpu_tflops)
    return build_cluster([node] * (num_nodes or 1), inter_node_gbps, "--gpu")


def _parse_node(spec: str, nvlink_domain_size: int | None) -> list[NodeGpus]:
    """'h100-sxm:8x4' -> four nodes of 8 H100-SXM; 'a100-40gb:8' -> one node."""
    from fstrain.core.plan.plancluster import NodeGpus
    from fstrain.errors import InputError

    name, _, counts = spec.rpartition(":")
    gpus_text, _, nodes_text = counts.partition("x")
    if not name or not gpus_text.isdigit() or (nodes_text and not nodes_text.isdigit()):
        raise InputError(f"expected GPU:COUNT[xNODES], got {spec!r}", "e.g. --node h100-sxm:8x4", "--node")
    gpus, copies = int(gpus_text), int(nodes_text or 1)
    if gpus < 1 or copies < 1:
        raise InputError(f"counts must be positive, got {spec!r}", "e.g. --node h100-sxm:8x4", "--node")
    return [NodeGpus(name, gpus, nvlink_domain_size=nvlink_domain_size)] * copies


def _choice(value: str, allowed: tuple[str, ...], flag: str) -> str:
    from fstrain.errors import InputError

    if value not in allowed:
        raise InputError(f"{value!r} is not one of {', '.join(allowed)}", "", flag)
    return value


def plan_document(
    result: PlanResult,
    plan_model: PlanModel,
    training: TrainingSpec,
    cluster: PlanCluster,
    assumptions: Assumptions,
    top: int,
    batch_note: str,
) -> dict[str, Any]:
    """The --json document: the top fitting plans, then the closest that do not fit."""
    from dataclasses import asdict

    shown = [*result.plans[:top], *result.rejected[:top]]
    return {
        "model": {
            "name": plan_model.name,
            "num_params": plan_model.num_params,
            "architecture": asdict(plan_model.spec) if plan_model.spec else None,
        },
        "cluster": {
            **asdict(cluster.summary()),
            "hosts": list(cluster.summary().hosts),
            "world_size": cluster.world_size,
            "nodes": [
                {"gpu": n.gpu.name, "num_gpus": n.num_gpus, "memory_bytes": n.memory_bytes, "host": n.host}
                for n in cluster.nodes
            ]
            if not cluster.uniform
            else None,
            "bounded_by": result.bounded_by or None,
        },
        "training": {**asdict(training), "global_batch_from": batch_note},
        "assumptions": asdict(assumptions),
        "considered": result.considered,
        "fitting_total": len(result.plans),
        "rejected_total": len(result.rejected),
        "plans": [p.to_dict(training.train_tokens) for p in shown],
        "suggestions": list(result.suggestions),
    }


def write_plan_file(
    path: str, result: PlanResult, plan_model: PlanModel, cluster: PlanCluster, train_tokens: int | None
) -> None:
    import yaml

    from fstrain.core.plan.planner import plan_file
    from fstrain.errors import InputError

    document = plan_file(result, plan_model, cluster, train_tokens).to_dict()
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("# Written by `fstrain plan`; read by `fstrain render` and `fstrain launch`.\n")
            yaml.safe_dump(document, handle, sort_keys=False)
    except OSError as exc:
        raise InputError(
            f"cannot write the plan: {exc.strerror}", "check the directory exists and is writable", path
        ) from None
