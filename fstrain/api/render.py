"""``render``: a plan -> the files a training job reads (ds_config.json, fsdp.yaml,
accelerate.yaml, fstrain.env, README, plan.yaml, and the configs of the trainers asked for:
hf_training_args.json, hf_ds_config.json, lightning.yaml, torchtitan.args), written into a new or empty directory
(fstrain/io/render_files.py: whole files or none, byte-identical for the same plan)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fstrain.api.plan import Planned, PlanRequest
    from fstrain.core.plan.planfile import PlanFile


@dataclass(frozen=True)
class RenderRequest:
    """What to render where: ``plan`` is a plan.yaml's path (`fstrain plan --out`), a plan
    (``api.plan(...).plan_file()``), or a :class:`~fstrain.api.PlanRequest` whose best plan is
    rendered. The rest are `fstrain render`'s options."""

    plan: str | Path | PlanFile | PlanRequest
    out: str | Path  # created; must be new or empty unless force
    force: bool = False  # replace the rendered files in an existing, non-empty directory
    ifname: str | None = None  # NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME
    rdma_devices: tuple[str, ...] = ()  # NCCL_IB_HCA
    nccl_topo: tuple[str | Path, ...] = ()  # NCCL topology XML copied in; one also sets NCCL_TOPO_FILE
    debug_env: bool = False  # NCCL_DEBUG=INFO, TORCH_DISTRIBUTED_DEBUG=DETAIL, DeepSpeed timers
    lr: float = 3e-4  # peak learning rate
    warmup_steps: int = 100
    train_steps: int = 0  # cosine decay to this step (0: constant after warm-up)
    # Also write the configs of these trainers (hf-trainer, lightning, torchtitan); a plan one of
    # them cannot run is refused (ConfigError) and nothing is written.
    trainers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Rendered:
    out_dir: Path
    files: tuple[Path, ...]  # written, sorted
    notes: Mapping[str, tuple[str, ...]]  # per file: what the renderer chose and why
    planned: Planned | None = None  # the search, when the request was a PlanRequest


def render(request: RenderRequest) -> Rendered:
    """Render the plan and write every file, or raise before anything is written."""
    from fstrain.api.plan import PlanRequest, plan
    from fstrain.core.render.options import TrainingOptions
    from fstrain.errors import ConfigError
    from fstrain.io.render_files import render_and_write

    planned: Planned | None = None
    if isinstance(request.plan, (str, Path)):
        plan_file = read_plan(request.plan)
    elif isinstance(request.plan, PlanRequest):
        check_out(request.out, force=request.force)  # before the search: nothing is half-done
        planned = plan(request.plan)
        if planned.result.best is None:
            raise ConfigError("no configuration fits: nothing to render",
                              next(iter(planned.result.suggestions), "pin fewer knobs or add GPUs"), "render")
        plan_file = planned.plan_file()
    else:
        plan_file = request.plan
    options = TrainingOptions(lr=request.lr, warmup_steps=request.warmup_steps, total_steps=request.train_steps)
    bundle, paths = render_and_write(plan_file, request.out, force=request.force, ifname=request.ifname,
                                     rdma_devices=request.rdma_devices, nccl_topo_files=request.nccl_topo,
                                     debug=request.debug_env, options=options, trainers=request.trainers)
    return Rendered(paths[0].parent, tuple(paths), {name: tuple(notes) for name, notes in sorted(bundle.notes.items())},
                    planned)


def read_plan(path: str | Path) -> PlanFile:
    """A plan.yaml (`fstrain plan --out`), checked; every failure is one InputError naming it."""
    from fstrain.io.render_files import read_plan_file

    return read_plan_file(Path(path))


def check_out(out: str | Path, *, force: bool) -> None:
    """Refuse a file, or a non-empty directory without ``force``, as the render's directory
    (`plan --render` asks before its search)."""
    from fstrain.io.render_files import check_out_dir

    check_out_dir(Path(out), force=force)
