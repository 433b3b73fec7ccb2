"""``fstrain render``: a plan -> ds_config.json, fsdp.yaml, accelerate.yaml, fstrain.env, README, and
with --trainer the configs of the Hugging Face Trainer, Lightning and torchtitan."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from fstrain.cli.output import console, print_json

if TYPE_CHECKING:
    from fstrain.core.plan.planfile import PlanFile


def register(app: typer.Typer) -> None:
    app.command(
        "render",
        help="Render the files a training job reads from a plan: fstrain render --plan plan.yaml -o DIR, or "
        "from plan options: fstrain render -o DIR --model llama3.1-8b --gpu h100-sxm --num-nodes 2",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(render_command)


def render_command(
    ctx: typer.Context,
    plan: Path | None = typer.Option(None, "--plan", help="plan.yaml written by `fstrain plan --out`; without it, "
                                     "the other options are `fstrain plan`'s and its best plan is rendered.",
                                     show_default=False),
    out: Path = typer.Option(..., "-o", "--out", help="Directory to write (created; must be new or empty).",
                             show_default=False),
    force: bool = typer.Option(False, "--force", help="Replace the rendered files in an existing, non-empty DIR."),
    ifname: str | None = typer.Option(
        None, "--ifname", help="Interface that reaches the master: NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME."
    ),
    rdma_devices: list[str] = typer.Option(
        [], "--rdma-device", help="RDMA device for NCCL_IB_HCA (repeat: --rdma-device mlx5_0 --rdma-device mlx5_1)."
    ),
    nccl_topo: list[Path] = typer.Option(
        [], "--nccl-topo", help="NCCL topology XML to copy into DIR; one file also sets NCCL_TOPO_FILE."
    ),
    debug_env: bool = typer.Option(
        False, "--debug-env", help="Debug run: NCCL_DEBUG=INFO, TORCH_DISTRIBUTED_DEBUG=DETAIL, DeepSpeed timers."
    ),
    lr: float = typer.Option(3e-4, "--lr", help="Peak learning rate."),
    warmup_steps: int = typer.Option(100, "--warmup-steps", min=0, help="Linear warm-up steps."),
    train_steps: int = typer.Option(
        0, "--train-steps", min=0, help="Total optimizer steps: cosine decay to the end (0: constant after warm-up)."
    ),
    trainers: list[str] = typer.Option(
        [], "--trainer", help="Also write the config of this training program: hf-trainer (TrainingArguments), "
        "lightning (Trainer and strategy arguments) or torchtitan (its command-line overrides); repeat for several."
    ),
    json_output: bool = typer.Option(False, "--json", help="Print one JSON document on stdout."),
    slurm: bool = typer.Option(False, "--slurm", help="Write the sbatch script of `fstrain launch --slurm` with "
                               "the other options (launch's) into DIR, without submitting it."),
) -> None:
    """Render the DeepSpeed, FSDP and Accelerate configs and the environment for a plan."""
    if slurm:
        from fstrain.cli.slurm import render_batch_script

        raise typer.Exit(render_batch_script(out, plan, list(ctx.args), json_output))
    from fstrain.api.render import RenderRequest, render

    request = RenderRequest(plan if plan is not None else plan_from_options(ctx), out, force=force,
                            ifname=ifname, rdma_devices=tuple(rdma_devices), nccl_topo=tuple(nccl_topo),
                            debug_env=debug_env, lr=lr, warmup_steps=warmup_steps, train_steps=train_steps,
                            trainers=tuple(trainers))
    rendered = render(request)
    if json_output:
        print_json({"out_dir": str(rendered.out_dir), "files": [path.name for path in rendered.files],
                    "notes": {name: list(notes) for name, notes in rendered.notes.items()}})
        return
    out_console = console()
    out_console.print(f"rendered {len(rendered.files)} files into [bold]{rendered.out_dir}[/bold]", soft_wrap=True)
    for path in rendered.files:
        out_console.print(f"  {path.name}", soft_wrap=True)
    for name, notes in rendered.notes.items():
        for note in notes:
            out_console.print(f"[dim]{name}: {note}[/dim]", soft_wrap=True)


def plan_from_options(ctx: typer.Context) -> PlanFile:
    """`fstrain plan ARGS`'s best plan: the arguments parsed with plan's own options, the search
    run through the API, its tables on stderr as `fstrain plan` shows them."""
    from fstrain.cli.main import module_commands
    from fstrain.cli.plan_output import print_plans
    from fstrain.cli.plan_request import check_plan_file, plan_request, run_plan
    from fstrain.errors import ConfigError, InputError

    args = list(ctx.args)
    if not args:
        raise InputError("no plan to render", "give --plan plan.yaml, or plan options such as --model tiny "
                         "--gpu h100-sxm", "fstrain render")
    with module_commands("plan")["plan"].make_context("plan", args, parent=ctx.parent) as context:
        params = context.params
    request = plan_request(params)
    check_plan_file(request, "--out")
    planned, _ = run_plan(request, params, quiet=False)
    print_plans(planned.result, planned.model, planned.training, planned.cluster, planned.assumptions,
                params["top"], planned.batch_note, None)
    if not planned.result.plans:
        raise ConfigError("`fstrain plan` found no plan to render (exit 1)",
                          "see its output above: pin fewer knobs or add GPUs", "fstrain render")
    return planned.plan_file()
