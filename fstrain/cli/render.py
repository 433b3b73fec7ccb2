"""``fstrain render``: a plan -> ds_config.json, fsdp.yaml, accelerate.yaml, fstrain.env, README."""

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
    json_output: bool = typer.Option(False, "--json", help="Print one JSON document on stdout."),
    slurm: bool = typer.Option(False, "--slurm", help="Write the sbatch script of `fstrain launch --slurm` with "
                               "the other options (launch's) into DIR, without submitting it."),
) -> None:
    """Render the DeepSpeed, FSDP and Accelerate configs and the environment for a plan."""
    if slurm:
        from fstrain.cli.slurm import render_batch_script

        raise typer.Exit(render_batch_script(out, plan, list(ctx.args), json_output))
    from fstrain.core.render.options import TrainingOptions
    from fstrain.io.render_files import read_plan_file, render_and_write

    plan_file = read_plan_file(plan) if plan is not None else plan_from_options(list(ctx.args))
    options = TrainingOptions(lr=lr, warmup_steps=warmup_steps, total_steps=train_steps)
    bundle, paths = render_and_write(
        plan_file,
        out,
        force=force,
        ifname=ifname,
        rdma_devices=rdma_devices,
        nccl_topo_files=nccl_topo,
        debug=debug_env,
        options=options,
    )
    if json_output:
        print_json(
            {
                "out_dir": str(paths[0].parent),
                "files": [path.name for path in paths],
                "notes": {name: list(notes) for name, notes in sorted(bundle.notes.items())},
            }
        )
        return
    out_console = console()
    out_console.print(f"rendered {len(paths)} files into [bold]{paths[0].parent}[/bold]", soft_wrap=True)
    for path in paths:
        out_console.print(f"  {path.name}", soft_wrap=True)
    for name, notes in sorted(bundle.notes.items()):
        for note in notes:
            out_console.print(f"[dim]{name}: {note}[/dim]", soft_wrap=True)


def plan_from_options(args: list[str]) -> PlanFile:
    """Run `fstrain plan ARGS --out TMP` (its tables go to stderr) and read the best plan back."""
    import tempfile

    from fstrain.cli.main import app
    from fstrain.errors import ConfigError, InputError
    from fstrain.io.render_files import read_plan_file

    if not args:
        raise InputError("no plan to render", "give --plan plan.yaml, or plan options such as --model tiny "
                         "--gpu h100-sxm", "fstrain render")
    with tempfile.TemporaryDirectory(prefix="fstrain-render-") as folder:
        path = Path(folder) / "plan.yaml"
        code = app(["plan", *args, "--out", str(path)], prog_name="fstrain", standalone_mode=False)
        if not path.exists():
            raise ConfigError(f"`fstrain plan` found no plan to render (exit {code})",
                              "see its output above: pin fewer knobs or add GPUs", "fstrain render")
        return read_plan_file(path)
