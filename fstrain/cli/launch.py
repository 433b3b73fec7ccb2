"""``fstrain launch``: run a training job on every selected host and never leave an orphan."""

from __future__ import annotations

import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, cast

import typer

from fstrain.cli import hostopts
from fstrain.cli import slurm as slurmopts
from fstrain.cli.output import console, print_json

if TYPE_CHECKING:
    from fstrain.core.launch.spec import NodeLaunch
    from fstrain.core.plan.planfile import PlanFile
    from fstrain.core.plan.schema import ModelSpec
    from fstrain.io.launch import RunOutcome

ENV_FILES = (".deepspeed_env", ".fstrain_env")  # read from ~ then the current directory; later wins


def register(app: typer.Typer) -> None:
    app.command(
        "launch",
        context_settings={"allow_interspersed_args": False},
        help="Launch a job on every selected host: fstrain launch --hostfile F -- python train.py ...",
    )(launch_command)


def launch_command(
    ctx: typer.Context,
    program: list[str] = typer.Argument(None, help="The program and its arguments (after --).", show_default=False),
    hostfile: str | None = hostopts.HOSTFILE,
    hosts: str | None = hostopts.HOSTS,
    include: str | None = hostopts.INCLUDE,
    exclude: str | None = hostopts.EXCLUDE,
    gpus_per_node: int | None = hostopts.GPUS_PER_NODE,
    ssh_config: str | None = hostopts.SSH_CONFIG,
    accept_new_hosts: bool = hostopts.ACCEPT_NEW,
    fanout: int = hostopts.FANOUT,
    nproc_per_node: str = typer.Option("auto", "--nproc-per-node", help="Processes per node, or 'auto' (slots)."),
    backend: str = typer.Option("torchrun", "--backend", help="torchrun or deepspeed."),
    no_local_rank: bool = typer.Option(False, "--no-local-rank", help="deepspeed backend: do not append "
                                       "--local_rank=N to the program's arguments (as deepspeed --no_local_rank)."),
    env: list[str] = typer.Option([], "--env", help="NAME=VALUE, or NAME to pass this environment's value, for "
                                  "every rank (repeatable)."),
    env_file: str | None = typer.Option(None, "--env-file", help="File of NAME=VALUE lines."),
    workdir: str | None = typer.Option(None, "--workdir", help="Working directory on every host (default: the "
                                       "current directory; checked first)."),
    python: str = typer.Option("python3", "--python", help="Interpreter on the hosts."),
    master_port: int | None = typer.Option(None, "--master-port", min=1, max=65535, help="Rendezvous port."),
    max_restarts: int = typer.Option(0, "--max-restarts", min=0, help="torchrun worker-group restarts."),
    run_dir: str | None = typer.Option(None, "--run-dir", help="Logs and manifest (default runs/<run id>)."),
    grace: float = typer.Option(15.0, "--grace", min=0, help="Seconds between SIGTERM and SIGKILL on teardown."),
    heartbeat_timeout: float = typer.Option(
        30.0, "--heartbeat-timeout", min=1, help="Seconds without an answer before a host counts as lost."
    ),
    plan_path: str | None = typer.Option(None, "--plan", help="plan.yaml from `fstrain plan --out`: render it and "
                                         "train with it (the bundled trainer when no PROGRAM is given)."),
    model: str | None = typer.Option(None, "--model", help="A shipped recipe (e.g. tiny): train it data-parallel."),
    recipe: str | None = typer.Option(None, "--recipe", help="A recipe file: train it data-parallel."),
    strategy: str | None = typer.Option(None, "--strategy", help="With --model/--recipe: ddp, zero1-3, fsdp-full, "
                                        "fsdp-grad-op, fsdp-hybrid (default fsdp-full; zero3 for deepspeed)."),
    micro_batch: int = typer.Option(4, "--micro-batch", min=1, help="With --model/--recipe: sequences per rank."),
    precision: str = typer.Option(
        "bf16", "--precision", help="With --model/--recipe: bf16, fp16, fp32, bf16-pure, amp-bf16 or amp-fp16."),
    steps: int = typer.Option(20, "--steps", min=1, help="Optimizer steps for the bundled trainer."),
    stall_timeout: str | None = typer.Option(None, "--stall-timeout", metavar="DURATION",
                                             help="No rank output for this long (e.g. 20m): collect every rank's "
                                             "stacks, name the odd ranks, stop the job (exit 124)."),
    finish_timeout: str | None = typer.Option(None, "--finish-timeout", metavar="DURATION",
                                              help="Some ranks finished and others still run after "
                                              "this long: the same as --stall-timeout."),
    detach: bool = typer.Option(False, "--detach", "-d", help="Return the run id once every node started; the "
                                "nodes supervise the job themselves (see fstrain runs/status/logs/stop). "
                                "With --slurm: print the job id and return at once."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the per-node commands; connect to nothing."),
    json_output: bool = typer.Option(False, "--json", help="Print the summary as one JSON document on stdout."),
    launcher: str = slurmopts.LAUNCHER,
    slurm: bool = slurmopts.SLURM,
    nodes: int | None = slurmopts.NODES,
    partition: str | None = slurmopts.PARTITION,
    time_limit: str | None = slurmopts.TIME,
    account: str | None = slurmopts.ACCOUNT,
    qos: str | None = slurmopts.QOS,
    constraint: str | None = slurmopts.CONSTRAINT,
    exclusive: bool = slurmopts.EXCLUSIVE,
    sbatch_args: list[str] = slurmopts.SBATCH_ARG,
    container_image: str | None = slurmopts.CONTAINER_IMAGE,
    container_mounts: str | None = slurmopts.CONTAINER_MOUNTS,
    slurm_render_only: bool = slurmopts.RENDER_ONLY,
) -> None:
    """Launch PROGRAM on every selected host (one torchrun or DeepSpeed launcher per node)."""
    from fstrain.core.launch.spec import BACKENDS
    from fstrain.errors import InputError

    if backend not in BACKENDS:
        raise InputError(f"unknown backend {backend!r}", f"use one of {', '.join(BACKENDS)}", "--backend")
    if slurm or slurm_render_only:
        slurmopts.check_submit_flags(hostfile, hosts, launcher, dry_run)
    else:
        slurmopts.check_no_submit_flags({"--nodes": nodes, "--partition": partition, "--time": time_limit,
                                         "--account": account, "--qos": qos, "--constraint": constraint,
                                         "--exclusive": exclusive, "--sbatch-arg": sbatch_args})
    allocation = None if slurm or slurm_render_only else slurmopts.choose_allocation(launcher, hostfile, hosts)
    if allocation is not None and detach:
        # srun steps end with the srun that started them: a detached run would die with this terminal.
        raise InputError("--detach cannot outlive the terminal inside a Slurm allocation (its srun steps end "
                         "with this command)", "submit the job with --slurm --detach instead, or run without "
                         "--detach", "--detach")
    if allocation is not None:
        selection = hostopts.HostSelection(slurmopts.allocation_hosts(allocation, hostfile, hosts, include, exclude,
                                                                      gpus_per_node), "Slurm job")
    elif not (slurm or slurm_render_only):
        slurmopts.check_container_flags(container_image, container_mounts)
        selection = hostopts.resolve_hosts(hostfile, hosts, include, exclude, gpus_per_node)
        if selection.source.startswith("localhost"):
            console().print(f"[dim]hosts: {selection.source}[/dim]")  # stderr: --json's stdout stays one document
    requested = parse_nproc(nproc_per_node)
    spec = job_spec(backend, list(program or []), plan_path, model, recipe, strategy, micro_batch, precision, steps)
    user_env = collect_env(env, env_file)
    timeouts = stall_timeouts(stall_timeout, finish_timeout)
    run_id = new_run_id()
    if slurm or slurm_render_only:
        raise typer.Exit(slurmopts.submit_launch(
            ctx, program=list(program or []), user_env=user_env, run_id=run_id,
            run_dir=run_dir, python_exe=sys.executable, render_only=slurm_render_only, detach=detach,
            json_output=json_output, nodes=nodes, gpus_per_node=gpus_per_node, partition=partition,
            time_limit=time_limit, account=account, qos=qos, constraint=constraint, exclusive=exclusive,
            sbatch_args=sbatch_args, container_image=container_image, container_mounts=container_mounts))
    folder = Path(run_dir) if run_dir else Path("runs") / run_id
    if dry_run:
        nprocs = resolve_nprocs(selection.hosts, requested, None)
        dry_run_output(selection.hosts, nprocs, backend, build_job(spec, selection.hosts, nprocs, python), python,
                       master_port, max_restarts, run_id, user_env, json_output, no_local_rank=no_local_rank)
        return
    connect = slurmopts.srun_connect(container_image, container_mounts) if allocation is not None else None
    if allocation is not None and not json_output:
        console().print(f"[dim]Slurm job {allocation.job_id}: every node runs its part as an srun step[/dim]")
    outcome = execute(selection.hosts, requested, backend, spec, python, master_port, max_restarts,
                      run_id, folder, user_env, workdir, grace, heartbeat_timeout, ssh_config, accept_new_hosts,
                      fanout, json_output, connect, *timeouts, no_local_rank=no_local_rank, detach=detach)
    raise typer.Exit(outcome.exit_code)


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


@dataclass(frozen=True)
class Job:
    """What runs on every rank: the program, and the plan it trains with (if any)."""

    program: list[str]
    plan: PlanFile | None
    bundled_trainer: bool
    steps: int = 0


def resolve_nprocs(hosts: list[Any], requested: int | None, gpu_counts: list[int] | None) -> list[int]:
    """Processes per host: --nproc-per-node, else slots, else the GPUs preflight found."""
    from fstrain.core.launch.spec import resolve_nproc

    counts: list[int | None] = list(gpu_counts) if gpu_counts is not None else [None] * len(hosts)
    return [resolve_nproc(h, requested, count) for h, count in zip(hosts, counts, strict=True)]


def job_spec(backend: str, program: list[str], plan_path: str | None, model: str | None, recipe: str | None,
             strategy: str | None, micro_batch: int, precision: str, steps: int) -> JobSpec:
    """--plan, or --model/--recipe (a data-parallel plan), or a bare PROGRAM; files read now."""
    from fstrain.core.launch.plan import DEFAULT_STRATEGY, check_strategy
    from fstrain.errors import InputError

    given = [flag for flag, value in (("--plan", plan_path), ("--model", model), ("--recipe", recipe)) if value]
    if len(given) > 1:
        raise InputError(f"{' and '.join(given)} cannot be combined", "give one of them", "/".join(given))
    if program:
        refuse_nested_launcher(program)
    if not given:
        if not program:
            raise InputError("no program to launch",
                             "put it after --: fstrain launch --hosts h1,h2 -- python train.py, "
                             "or train the bundled model: fstrain launch --model tiny", "PROGRAM")
        return JobSpec(program)
    if plan_path:
        from fstrain.io.render_files import read_plan_file

        return JobSpec(program, plan=read_plan_file(Path(plan_path)), flag="--plan", steps=steps)
    from fstrain.io.recipes import load_recipe_file, load_shipped_recipe

    loaded = load_shipped_recipe(str(model)) if model else load_recipe_file(str(recipe))
    chosen = strategy or DEFAULT_STRATEGY[backend]
    check_strategy(chosen)
    return JobSpec(program, model=loaded.model, flag=given[0], strategy=chosen, micro_batch=micro_batch,
                   precision=precision, steps=steps)


def refuse_nested_launcher(program: list[str]) -> None:
    from fstrain.core.launch.nested import nested_launcher, nested_launcher_hint
    from fstrain.errors import InputError

    launcher = nested_launcher(program)
    if launcher is not None:
        raise InputError(f"the program is itself a launcher ({launcher}): it would start its own ranks inside "
                         "each of the ranks fstrain starts", nested_launcher_hint(launcher), "PROGRAM")


def build_job(spec: JobSpec, hosts: list[Any], nprocs: list[int], python: str, device: str = "cpu") -> Job:
    """The job for these hosts and process counts (the plan must match the world size)."""
    from fstrain.core.launch.plan import check_plan_fits_launch, data_parallel_plan, trainer_program
    from fstrain.errors import InputError

    if spec.plan is None and spec.model is None:
        return Job(spec.program, None, False)
    if len(set(nprocs)) != 1:
        raise InputError(f"hosts run different numbers of processes ({nprocs})",
                         "the bundled trainer's plans need the same --nproc-per-node everywhere", "--nproc-per-node")
    plan = spec.plan
    if plan is None:
        assert spec.model is not None
        plan = data_parallel_plan(spec.model, num_nodes=len(hosts), procs_per_node=nprocs[0],
                                  strategy=spec.strategy, micro_batch_size=spec.micro_batch,
                                  precision=spec.precision, hosts=tuple(h.name for h in hosts), gpu=device)
    check_plan_fits_launch(plan, sum(nprocs), spec.flag)
    if spec.program:
        return Job(spec.program, plan, False, spec.steps)
    return Job(trainer_program(python, plan, steps=spec.steps), plan, True, spec.steps)


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
    from fstrain.core.launch.spec import parse_env_assignment, parse_env_file
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


def dry_run_output(hosts: list[Any], nprocs: list[int], backend: str, job: Job, python: str,
                   master_port: int | None, max_restarts: int, run_id: str, user_env: dict[str, str],
                   json_output: bool, *, no_local_rank: bool = False) -> None:
    """The exact per-node commands and (masked) environment; no connection is opened."""
    from fstrain.core.launch.spec import master_port_candidates, plan_launches
    from fstrain.io.connect import is_local
    from fstrain.io.launch import node_summary

    master = "127.0.0.1" if all(is_local(h) for h in hosts) else hosts[0].name
    port = master_port or master_port_candidates(run_id)[0]
    launches = plan_launches(hosts, backend=backend, nprocs=nprocs, program=job.program, python=python,
                             master_addr=master, master_port=port, run_id=run_id, max_restarts=max_restarts,
                             env=user_env, per_node_env=[], no_local_rank=no_local_rank)
    note = ("dry run: nothing was contacted; the master address and port are checked, and "
            "NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME chosen per node, at launch")
    if json_output:
        print_json({"run_id": run_id, "dry_run": True, "note": note, "master_addr": master, "master_port": port,
                    "plan": job.plan.to_dict() if job.plan else None,
                    "nodes": [node_summary(launch, None) for launch in launches]})
        return
    if job.plan is not None:
        print_plan(job.plan)
    print_launches(launches)
    console().print(f"[dim]{note}[/dim]")


def print_plan(plan: PlanFile, where: str = "each node's run directory at launch") -> None:
    from fstrain.core.launch.plan import trainer_backend
    from fstrain.core.plan.planner import describe_knobs

    k = plan.knobs
    console().print(f"plan: {plan.model.name}: {describe_knobs(k)}, {k.precision}, "
                    f"global batch {k.global_batch_size} x {k.seq_len} tokens; trainer backend "
                    f"{trainer_backend(plan)}; configs rendered into {where}", markup=False)


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def print_launches(launches: list[NodeLaunch]) -> None:
    from fstrain.core.launch.spec import mask_env

    for launch in launches:
        processes = "process" if launch.nproc == 1 else "processes"
        sys.stdout.write(f"# node {launch.node_rank}: {launch.host.label()} ({launch.nproc} {processes})\n")
        for name, value in mask_env(launch.env).items():
            sys.stdout.write(f"{name}={shlex.quote(value)}\n")
        sys.stdout.write(shlex.join(launch.argv) + "\n")
    sys.stdout.flush()


def execute(hosts: list[Any], requested: int | None, backend: str, spec: JobSpec, python: str,
            master_port: int | None, max_restarts: int, run_id: str, folder: Path, user_env: dict[str, str],
            workdir: str | None, grace: float, heartbeat_timeout: float, ssh_config: str | None,
            accept_new_hosts: bool, fanout: int, json_output: bool, connector: Any = None,
            stall_timeout_s: float | None = None, finish_timeout_s: float | None = None, *,
            no_local_rank: bool = False, detach: bool = False) -> RunOutcome:
    from fstrain.core.launch.spec import plan_launches
    from fstrain.io.connect import check_distinct_endpoints, make_connector
    from fstrain.io.fanout import HostPool
    from fstrain.io.launch import (
        RunOptions,
        choose_rendezvous,
        preflight,
        prewarm_nodes,
        remote_run_dir,
        run_nodes,
        write_manifest,
    )
    from fstrain.io.localout import GuardedStream, stdout_may_fail

    out = console()
    if connector is None:  # over SSH; srun steps (a Slurm allocation) name each node once already
        check_distinct_endpoints(hosts, ssh_config)
    connect = connector or make_connector(ssh_config, accept_new_hosts=accept_new_hosts)
    workdir_is_default = workdir is None
    if workdir is None:  # like DeepSpeed's launcher: the same directory as here, checked on every host
        workdir = os.getcwd()
    packages = ("torch", "deepspeed") if backend == "deepspeed" else ("torch",)
    with HostPool(hosts, connect, fanout=fanout) as pool:
        # Attached: every node's launcher starts importing torch while the hosts are checked.
        prewarmed = [] if detach else prewarm_nodes(pool, backend, python, workdir, user_env, run_id)
        try:
            facts = preflight(pool, python, workdir, packages=packages, workdir_is_default=workdir_is_default)
            rendezvous = choose_rendezvous(pool, connect, facts, python, run_id, master_port)
            nprocs = resolve_nprocs(hosts, requested, [int(f.info.get("nvidia_gpus") or 0) for f in facts])
            gpus_found = any(f.info.get("nvidia_gpus") for f in facts)
            job = build_job(spec, hosts, nprocs, python,
                            "gpu (not planned: see fstrain plan)" if gpus_found else "cpu")
            per_node = [interface_env(ifname, user_env) for ifname in rendezvous.interfaces]
            launches = plan_launches(hosts, backend=backend, nprocs=nprocs, program=job.program, python=python,
                                     master_addr=rendezvous.master_addr, master_port=rendezvous.master_port,
                                     run_id=run_id, max_restarts=max_restarts, env=user_env, per_node_env=per_node,
                                     no_local_rank=no_local_rank)
            run_dirs = [remote_run_dir(h, f.info.get("home"), run_id, folder)
                        for h, f in zip(hosts, facts, strict=True)]
            node_files = [rendered_files(job.plan, d, job.steps) for d in run_dirs] if job.plan else []
            if job.plan is not None:
                print_plan(job.plan, f"each node's run directory ({hosts[0].name}: {run_dirs[0]})")
            procs = nprocs[0] if len(set(nprocs)) == 1 else nprocs
            out.print(f"run {run_id}: {plural(len(hosts), 'node')} x {procs} "
                      f"{'process' if procs == 1 else 'processes'}, {backend}, master "
                      f"{rendezvous.master_addr}:{rendezvous.master_port}; "
                      + ("output in each node's run directory (fstrain logs)" if detach else f"logs in {folder}/logs"))
            options = RunOptions(run_id=run_id, run_dir=folder, grace_s=grace, heartbeat_timeout_s=heartbeat_timeout,
                                 workdir=workdir, node_run_dirs=run_dirs, node_files=node_files,
                                 color=sys.stdout.isatty() and not json_output,
                                 # GuardedStream writes and flushes like the stream it guards.
                                 out=cast(TextIO, GuardedStream(*((sys.stderr, "stderr") if json_output
                                                                  else (sys.stdout, "stdout")))),
                                 stall_timeout_s=stall_timeout_s, finish_timeout_s=finish_timeout_s)
            if detach:
                from fstrain.cli.runs import start_detached_run

                return start_detached_run(hosts, launches, connect, python, options, rendezvous, run_dirs, backend,
                                          ssh_config, facts, user_env, job.plan, json_output)
            from fstrain.io.runs import register

            register(run_id, folder, detached=False)
            outcome = run_nodes(launches, pool.open_transport, python, options, prewarmed)
        finally:
            for node in prewarmed:
                if node is not None:
                    node.close()
    summary = fetch_training_summary(hosts[0], run_dirs[0], connect, folder) if job.bundled_trainer \
        and outcome.exit_code == 0 else None
    document = write_manifest(folder / "manifest.json", run_id=run_id, backend=backend, rendezvous=rendezvous,
                              launches=launches, outcome=outcome, facts=facts, env=user_env,
                              plan=job.plan.to_dict() if job.plan else None)
    if summary is not None:
        document["training_summary"] = summary
    if json_output:
        with stdout_may_fail():
            print_json(document)
    else:
        print_summary(outcome)
        if summary is not None:
            with stdout_may_fail():
                print_training_summary(summary)
    return outcome


def rendered_files(plan: PlanFile, run_dir: str, steps: int) -> dict[str, str]:
    """The configs the bundled trainer reads, rendered for the node's run directory, with the
    learning-rate schedule fitted to the run: 10 % warm-up, cosine decay to the last step."""
    from fstrain.core.render.bundle import render_bundle
    from fstrain.core.render.options import TrainingOptions
    from fstrain.io.render_files import bundle_files

    options = TrainingOptions(warmup_steps=max(1, steps // 10), total_steps=steps)
    bundle = render_bundle(plan, out_dir=run_dir, options=options)
    return {name: content.decode() for name, content in bundle_files(bundle).items()}


def fetch_training_summary(host: Any, run_dir: str, connect: Any, folder: Path) -> dict[str, Any] | None:
    """Rank 0's summary.json (node 0), copied into the local run directory."""
    import json

    transport = connect(host)
    try:
        result = transport.run(["cat", f"{run_dir}/summary.json"], timeout_s=30)
    finally:
        transport.close()
    if not result.ok:
        console().print(f"[yellow]no training summary on {host.label()}: {result.error or result.stderr.strip()}")
        return None
    summary: dict[str, Any] = json.loads(result.stdout)
    try:
        (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    except OSError as exc:
        from fstrain.io.localout import describe, warn

        warn(f"cannot write {folder / 'summary.json'} ({describe(exc)})")
    return summary


def print_training_summary(summary: dict[str, Any]) -> None:
    import json

    console().print("training summary (rank 0):")
    sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    sys.stdout.flush()


def interface_env(ifname: str, user_env: dict[str, str]) -> dict[str, str]:
    """NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME: the interface that routes to the master,
    unless the user set them."""
    if not ifname:
        return {}
    return {name: ifname for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME") if name not in user_env}


def describe_exit(code: int | None, error: str | None) -> str:
    import signal

    if code is None:
        return error or "unknown"
    if code > 128 and code - 128 in signal.valid_signals():
        return f"{code} ({signal.Signals(code - 128).name})"
    return str(code)


def print_summary(outcome: RunOutcome) -> None:
    from rich.table import Table

    from fstrain.io.launch import last_lines

    table = Table(show_edge=False, pad_edge=False)
    for column in ("host", "node", "exit", "seconds", "error"):
        table.add_column(column)
    for node in outcome.nodes:
        ok = node.exit_code == 0
        seconds = (node.ended or time.time()) - node.started
        code = describe_exit(node.exit_code, node.error)
        table.add_row(node.launch.host.label(), str(node.launch.node_rank),
                      f"[{'green' if ok else 'red'}]{code}[/]", f"{seconds:.1f}", node.error or "")
    out = console()
    out.print(table)
    if outcome.first_failure is not None:
        failed = outcome.nodes[outcome.first_failure]
        where = f"node {failed.launch.node_rank} ({failed.launch.host.label()})"
        if failed.failure is not None:  # the rank's own code (torchrun itself exits 1)
            what = f"{failed.failure.describe()} on {where}"
        else:
            what = f"{where}, exit {describe_exit(failed.exit_code, failed.error)}"
        out.print(f"[red]first failure: {what}[/red]; its last lines:")
        for line in last_lines(failed):
            out.print(f"  {line}", markup=False)
    if outcome.stall is not None:
        print_stall(outcome.stall)
    verdict = {"ok": "[green]all nodes finished ok[/green]", "interrupted": "[yellow]interrupted (Ctrl-C)[/yellow]",
               "stalled": "[red]stalled[/red]",
               "terminated": "[yellow]terminated (SIGTERM)[/yellow]"}.get(outcome.reason, "[red]failed[/red]")
    out.print(f"{verdict}; exit code {outcome.exit_code}")


def print_stall(report: dict[str, Any]) -> None:
    """Why the job counts as stalled, where each group of ranks was, and the odd ranks."""
    out = console()
    odd = report.get("odd_ranks") or []
    named = f"; odd {'rank' if len(odd) == 1 else 'ranks'}: {', '.join(map(str, odd))}" if odd else ""
    out.print(f"[red]stalled: {report['reason']}{named}[/red]")
    for line in report.get("summary", []):
        out.print(f"  {line}", markup=False)
    for trace in report.get("nccl_traces", []):
        out.print(f"  NCCL flight recorder dump: {trace}", markup=False)
    out.print(f"  stacks: {report['folder']}", markup=False)
    if report.get("unanswered_nodes"):
        out.print(f"  no stacks from node(s) {', '.join(map(str, report['unanswered_nodes']))}")
