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
    from fstrain.core.plan.plancluster import PlanCluster
    from fstrain.core.plan.planner import PlanModel, PlanResult, TrainingSpec

def register(app: typer.Typer) -> None:
    app.command("plan", help="Plan sharding, memory and throughput for a model on a cluster (a dry run).")(plan_command)


def plan_command(
    model: str | None = typer.Option(
        None, "--model", "-m",
        help="A shipped recipe (tiny, llama3.1-8b, ...), or ORG/NAME from the local Hugging Face cache.",
    ),
    recipe: str | None = typer.Option(None, "--recipe", help="Your own recipe YAML, or a Hugging Face config.json."),
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
    loss: str | None = typer.Option(
        None, "--loss",
        help="How the training code computes the loss, which sets the logits' memory: full (cross-entropy on "
        "an fp32 copy: the bundled trainer, torchtitan, Hugging Face), fused (a fused kernel on the "
        "compute-dtype logits, e.g. flash-attn's: llm-foundry's default), megatron (Megatron-LM's "
        "vocab-parallel cross-entropy as DeepSpeed's Megatron-LM examples run it), megatron-core "
        "(Megatron-LM core's, as ATorch's fork runs it) or chunked[:N] "
        "(torchtune's CEWithChunkedOutputLoss, N chunks of tokens, default 8; the bundled trainer runs it too), "
        "or none (no vocabulary head: a classification or regression head, e.g. BERT fine-tuning; the recipe's "
        "pooler and num_labels describe it), megatron-inplace (Megatron-LM core's current one) or litgpt "
        "(LitGPT's chunked_cross_entropy, no upcast). Default: the --framework's.",
    ),
    framework: str = typer.Option(
        "fstrain", "--framework",
        help="The training code whose memory habits to model: fstrain (the bundled trainer), torchtitan, "
        "megatron, nanotron, deepspeed (a hand-written DeepSpeed config), lightning (Fabric/LitGPT, FSDP1), "
        "accelerate, hf-trainer or flash-attn (docs/planner.md, framework profiles).",
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
    fsdp2_no_sync: bool = typer.Option(
        False, "--fsdp2-no-sync",
        help="FSDP2 accumulates micro-batches under set_requires_gradient_sync(False): every gradient stays "
        "unsharded in the reduce dtype (fp32: --assume fsdp_reduce_bytes_per_element) until the last "
        "micro-batch reduce-scatters it once. Plans fsdp-* strategies without --pp. Not run by the bundled trainer.",
    ),
    tp_replicated_logits: bool = typer.Option(
        False, "--tp-replicated-logits",
        help="Under --tp the output layer gathers its logits to every TP rank (the loss is not "
        "vocabulary-parallel) and the token embedding stays whole on each (KempnerForge's TP plan). "
        "Plans without --pp. Not run by the bundled trainer.",
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
    calibrate: str | None = typer.Option(None, "--calibrate", metavar="FILE|RUN_DIR",
                                         help="Measured numbers in place of assumptions: a bench JSON "
                                         "(fstrain bench --out), a finished run's directory or report "
                                         "(fstrain report --json; its summary, else the tokens/s its "
                                         "ranks printed), or the trainer's summary.json."),
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
    params = dict(locals())  # the options by name, as `render` gets them from click for plan_request
    from fstrain.cli.plan_request import check_plan_file, plan_request, run_plan

    request = plan_request(params)
    if out or render_dir:
        check_plan_file(request, "--out" if out else "--render")
    if render_dir:
        from fstrain.api.render import check_out

        check_out(render_dir, force=force)  # before any work: nothing is half-written
    planned, calibration = run_plan(request, params, quiet=json_output)
    result, plan_model, training, cluster = planned.result, planned.model, planned.training, planned.cluster
    assumptions, batch_note = planned.assumptions, planned.batch_note
    if out and result.plans:  # nothing fits: the output says what would, and no file is written
        write_plan_file(out, result, plan_model, cluster, training.train_tokens)
    if render_dir and result.plans:
        from fstrain.api.render import RenderRequest, render

        rendered = render(RenderRequest(planned.plan_file(), render_dir, force=force))
        if not json_output:
            from fstrain.cli.output import console

            console().print(f"rendered {len(rendered.files)} files into {render_dir}")
    traced: dict[str, Any] | None = None
    if trace:
        from fstrain.cli.plan_trace import run_trace

        traced = run_trace(planned)
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

    from fstrain.core.plan.errorband import plan_error_band

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
        "plans": [{**p.to_dict(training.train_tokens), "error_band": plan_error_band(
            p.knobs, cluster.num_nodes, p.memory.peak, p.time.tokens_per_s if p.time else None,
            architecture=plan_model.spec is not None)} for p in shown],
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
