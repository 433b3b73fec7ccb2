"""What a launch runs: the job (a program, a plan, the bundled trainer) and its environment,
checked before any host is contacted, and fitted to the hosts once their facts are known."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fstrain.api.requests import JobRequest
    from fstrain.core.plan.planfile import PlanFile
    from fstrain.core.plan.schema import ModelSpec

ENV_FILES = (".deepspeed_env", ".fstrain_env")  # read from ~ then the current directory; later wins


def stall_timeouts(stall_timeout: str | None, finish_timeout: str | None) -> tuple[float | None, float | None]:
    from fstrain.core.launch.duration import parse_duration_s

    return (parse_duration_s(stall_timeout, "--stall-timeout") if stall_timeout else None,
            parse_duration_s(finish_timeout, "--finish-timeout") if finish_timeout else None)


@dataclass(frozen=True)
class JobSpec:
    """What the user asked to run, checked before any host is contacted."""

    program: list[str]
    plan: PlanFile | None = None  # from --plan
    model: ModelSpec | None = None  # from --model/--recipe: planned data-parallel once nprocs are known
    flag: str = ""  # --plan, --model or --recipe
    strategy: str = ""
    micro_batch: int = 1
    precision: str = "bf16"
    steps: int = 0
    tensorboard: str | None = None  # the bundled trainer's --tensorboard DIR

    @property
    def bundled_trainer(self) -> bool:
        """Whether the ranks run fstrain's own trainer (``python -m fstrain.train``)."""
        return (self.plan is not None or self.model is not None) and not self.program


@dataclass(frozen=True)
class Job:
    """What runs on every rank: the program, and the plan it trains with (if any)."""

    program: list[str]
    plan: PlanFile | None
    bundled_trainer: bool
    steps: int = 0


def resolve_nprocs(hosts: list[Any], requested: int | None, gpu_counts: list[int] | None) -> list[int]:
    """Processes per host: --nproc-per-node, else slots, else the GPUs preflight found."""
    from fstrain.core.job.spec import resolve_nproc

    counts: list[int | None] = list(gpu_counts) if gpu_counts is not None else [None] * len(hosts)
    return [resolve_nproc(h, requested, count) for h, count in zip(hosts, counts, strict=True)]


def job_spec(request: JobRequest) -> JobSpec:
    """--plan, or --model/--recipe (a data-parallel plan), or a bare PROGRAM; files read now."""
    from fstrain.core.job.plan import DEFAULT_STRATEGY, check_strategy, check_supported
    from fstrain.errors import InputError

    program = list(request.program)
    given = [flag for flag, value in (("--plan", request.plan), ("--model", request.model),
                                      ("--recipe", request.recipe)) if value]
    if len(given) > 1:
        raise InputError(f"{' and '.join(given)} cannot be combined", "give one of them", "/".join(given))
    if program:
        refuse_nested_launcher(program)
        if request.tensorboard:
            raise InputError("the flag is the bundled trainer's, and this launch runs PROGRAM",
                             "give your program its own TensorBoard flag after --, or print metric lines "
                             "(docs/observability.md)", "--tensorboard")
    if not given:
        if not program:
            raise InputError("no program to launch",
                             "put it after --: fstrain launch --hosts h1,h2 -- python train.py, "
                             "or train the bundled model: fstrain launch --model tiny", "PROGRAM")
        return JobSpec(program)
    if request.plan:
        from fstrain.io.render_files import read_plan_file

        plan = read_plan_file(Path(request.plan))
        if not program:  # the bundled trainer runs it: what it cannot build stops here, not on every rank
            check_supported(plan.model)
        return JobSpec(program, plan=plan, flag="--plan", steps=request.steps, tensorboard=request.tensorboard)
    from fstrain.io.recipes import load_model, load_recipe_file

    loaded = load_model(str(request.model)) if request.model else load_recipe_file(str(request.recipe))
    if not program:
        check_supported(loaded.model)
    chosen = request.strategy or DEFAULT_STRATEGY[request.backend]
    check_strategy(chosen)
    return JobSpec(program, model=loaded.model, flag=given[0], strategy=chosen, micro_batch=request.micro_batch,
                   precision=request.precision, steps=request.steps, tensorboard=request.tensorboard)


def refuse_nested_launcher(program: list[str]) -> None:
    from fstrain.core.job.nested import nested_launcher, nested_launcher_hint
    from fstrain.errors import InputError

    launcher = nested_launcher(program)
    if launcher is not None:
        raise InputError(f"the program is itself a launcher ({launcher}): it would start its own ranks inside "
                         "each of the ranks fstrain starts", nested_launcher_hint(launcher), "PROGRAM")


def build_job(spec: JobSpec, hosts: list[Any], nprocs: list[int], python: str, device: str = "cpu") -> Job:
    """The job for these hosts and process counts (the plan must match the world size)."""
    from fstrain.core.job.plan import check_plan_fits_launch, data_parallel_plan, trainer_program
    from fstrain.errors import InputError

    if spec.plan is None and spec.model is None:
        return Job(spec.program, None, False)
    if len(set(nprocs)) != 1:
        raise InputError(f"hosts run different numbers of processes ({nprocs})",
                         "the bundled trainer's plans need the same --nproc-per-node everywhere", "--nproc-per-node")
    plan = spec.plan
    if plan is None:
        assert spec.model is not None
        from fstrain.core.plan.schema import ClusterSummary

        cluster = ClusterSummary(num_nodes=len(hosts), gpus_per_node=nprocs[0], gpu=device, gpu_memory_bytes=0,
                                 hosts=tuple(h.name for h in hosts))
        plan = data_parallel_plan(spec.model, cluster, strategy=spec.strategy, micro_batch_size=spec.micro_batch,
                                  precision=spec.precision)
    check_plan_fits_launch(plan, sum(nprocs), spec.flag)
    if spec.program:
        return Job(spec.program, plan, False, spec.steps)
    return Job(trainer_program(python, plan, steps=spec.steps, tensorboard=spec.tensorboard), plan, True, spec.steps)


def parse_nproc(value: str) -> int | None:
    from fstrain.errors import InputError

    if value == "auto":
        return None
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= 1024:
        raise InputError(f"--nproc-per-node must be an integer 1-1024 or 'auto', got {value[:20]!r}",
                         "give the number of processes (GPUs) per node, e.g. --nproc-per-node 8", "--nproc-per-node")
    return int(value)


def collect_env(assignments: list[str], env_file: str | None) -> dict[str, str]:
    """.deepspeed_env and .fstrain_env (home, then here), then --env-file, then --env: later wins."""
    from fstrain.core.job.spec import parse_env_assignment, parse_env_file
    from fstrain.errors import InputError
    from fstrain.io.userfiles import read_text_bounded

    merged: dict[str, str] = {}
    for folder in (Path.home(), Path.cwd()):
        for name in ENV_FILES:
            path = folder / name
            if path.is_file():
                merged.update(parse_env_file(read_text_bounded(path, "env file"), str(path)))
    if env_file:
        path = Path(env_file)
        if not path.is_file():
            raise InputError("env file not found", "check the path given to --env-file", env_file)
        merged.update(parse_env_file(read_text_bounded(path, "env file"), env_file))
    for assignment in assignments:
        if "=" not in assignment:  # --env NAME: the value comes from here, never on a command line
            name, _ = parse_env_assignment(f"{assignment}=", "--env")  # the name's own checks
            if name not in os.environ:
                raise InputError(f"{name!r} is not set in this environment",
                                 f"export {name}=... first, or give --env {name}=VALUE", "--env")
            merged[name] = os.environ[name]
            continue
        name, value = parse_env_assignment(assignment, "--env")
        merged[name] = value
    return merged


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + os.urandom(3).hex()


def rendered_files(plan: PlanFile, run_dir: str, steps: int) -> dict[str, str]:
    """The configs the bundled trainer reads, rendered for the node's run directory, with the
    learning-rate schedule fitted to the run: 10 % warm-up, cosine decay to the last step."""
    from fstrain.core.render.bundle import render_bundle
    from fstrain.core.render.options import TrainingOptions
    from fstrain.io.render_files import bundle_files

    options = TrainingOptions(warmup_steps=max(1, steps // 10), total_steps=steps)
    bundle = render_bundle(plan, out_dir=run_dir, options=options)
    return {name: content.decode() for name, content in bundle_files(bundle).items()}


def interface_env(ifname: str, user_env: dict[str, str]) -> dict[str, str]:
    """NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME: the interface that routes to the master,
    unless the user set them."""
    if not ifname:
        return {}
    return {name: ifname for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME") if name not in user_env}
