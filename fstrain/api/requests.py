"""Typed requests: what a caller asks fstrain to do, grouped as the command line groups its
options. The CLI parses argv into these once and passes them whole; a notebook, a scheduler or
a test builds them directly (see docs/api.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fstrain.core.runs.limits import RunLimits


@dataclass(frozen=True)
class HostRequest:
    """Which hosts, and how to reach them (`--hostfile`, `--hosts`, ...; docs/hosts.md)."""

    hostfile: str | None = None
    hosts: str | None = None  # a Slurm-style list: 'node[01-04]', 'a,b', 'user@h:2222'
    include: str | None = None  # DeepSpeed syntax: 'host1:0,1@host2'
    exclude: str | None = None
    gpus_per_node: int | None = None  # slots of hosts whose hostfile line gives none
    ssh_config: str | None = None  # default ~/.ssh/config
    accept_new_hosts: bool = False
    fanout: int = 64  # hosts contacted at once
    launcher: str = "auto"  # ssh, srun (inside a Slurm allocation), or auto


@dataclass(frozen=True)
class JobRequest:
    """What every rank runs: a program, or a plan / recipe for the bundled trainer."""

    program: tuple[str, ...] = ()
    backend: str = "torchrun"  # or deepspeed
    nproc_per_node: int | None = None  # None: the host's slots, else its GPUs
    plan: str | None = None  # a plan.yaml from `fstrain plan --out`
    model: str | None = None  # a shipped recipe or Hugging Face id, trained data-parallel
    recipe: str | None = None  # a recipe YAML or config.json, trained data-parallel
    strategy: str | None = None  # with model/recipe: ddp, zero1-3, fsdp-* (default per backend)
    micro_batch: int = 4
    precision: str = "bf16"
    steps: int = 20  # optimizer steps of the bundled trainer
    tensorboard: str | None = None  # the bundled trainer's event folder on node 0 ('{run_dir}/tb' allowed)
    env: Mapping[str, str] = field(default_factory=dict)  # for every rank (already collected)
    python: str = "python3"  # the interpreter on the hosts
    workdir: str | None = None  # default: this directory, checked on every host
    no_local_rank: bool = False  # deepspeed backend: no --local_rank=N argument
    checkpoint_interval: int = 0  # the bundled trainer: checkpoint every N steps (0: at the end only)


@dataclass(frozen=True)
class RunSettings:
    """How the run is kept: where, its rendezvous, and the rules that end it."""

    run_id: str | None = None  # default: a new one (time and random suffix)
    run_dir: str | None = None  # default runs/<run id>
    master_port: int | None = None
    # With on_failure "stop": torchrun's own worker-group restarts (the same processes' world);
    # with "restart" or "exclude": fstrain's attempts after the first (docs/recovery.md).
    max_restarts: int = 0
    on_failure: str = "stop"  # stop | restart (the same hosts) | exclude (the guilty hosts, spares in)
    min_nodes: int = 1  # a run that would shrink below this many nodes ends
    checkpoint_dir: str | None = None  # FSTRAIN_CHECKPOINT_DIR (default node 0's RUN_DIR/checkpoints)
    grace_s: float = 15.0  # SIGTERM to SIGKILL on teardown
    heartbeat_timeout_s: float = 30.0  # silence before a host counts as lost
    stall_timeout_s: float | None = None  # no rank output for this long: stacks, then stop (124)
    finish_timeout_s: float | None = None  # ranks finished apart by this long: the same
    detach: bool = False  # return once every node has started; the nodes supervise the job
    metrics_textfile: str | None = None  # each node's watchdog writes Prometheus textfiles here

    @property
    def limits(self) -> RunLimits:
        """The four time rules above as the one value the driver, the supervisor and the nodes get."""
        return RunLimits(self.grace_s, self.heartbeat_timeout_s, self.stall_timeout_s, self.finish_timeout_s)


@dataclass(frozen=True)
class TrackerRequest:
    """Experiment trackers the run is logged to from the process that follows it
    (docs/observability.md#trackers): its parameters, every rank's steps, its events and end."""

    mlflow: str | None = None  # an MLflow tracking URI: http://host:5000, or a local store (file:, sqlite:)
    mlflow_experiment: str = "fstrain"  # the MLflow experiment the run goes into (created if missing)
    wandb: str | None = None  # a Weights & Biases project
    wandb_offline: bool = False  # W&B's files under RUN_DIR/wandb only, for `wandb sync` later

    @property
    def any(self) -> bool:
        return bool(self.mlflow or self.wandb)


@dataclass(frozen=True)
class LaunchRequest:
    hosts: HostRequest = field(default_factory=HostRequest)
    job: JobRequest = field(default_factory=JobRequest)
    run: RunSettings = field(default_factory=RunSettings)
    container_image: str | None = None  # Slurm with Pyxis: every srun step in this image
    container_mounts: str | None = None
    container_default_mounts: bool = True  # Pyxis: the working and run directories mounted too
    trackers: TrackerRequest = field(default_factory=TrackerRequest)


@dataclass(frozen=True)
class SlurmRequest:
    """`launch --slurm`'s batch job: what sbatch is asked for (`fstrain launch --slurm`)."""

    nodes: int | None = None  # default 1
    gpus_per_node: int | None = None
    partition: str | None = None
    time_limit: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclusive: bool = False
    cpus_per_rank: int | None = None  # --cpus-per-task = ranks per node x this (default 4)
    sbatch_args: tuple[str, ...] = ()  # more sbatch options, as given
