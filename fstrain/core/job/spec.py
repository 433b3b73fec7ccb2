"""What `fstrain launch` runs where: per-node argv and environment, as values.

Pure: the launcher (fstrain/io/launch.py) probes the hosts, then asks this module for the exact
command of every node, so `--dry-run` and the real run print the same thing and the arithmetic
is tested without a cluster.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fstrain.core.hosts.hostfile import Host
from fstrain.errors import ConfigError, InputError

BACKENDS = ("torchrun", "deepspeed", "direct")
# --backend direct: the script (fstrain/io/remote/ranks.py) that starts a node's ranks, written
# into its run directory by the watchdog (``files`` in its header) and run there as the job.
DIRECT_SCRIPT = "fstrain-ranks.py"
# How fstrain starts its own scripts on a host (fstrain/io/remote/: the watchdog, fstrain-ranks.py,
# the run-control and reachability commands), which import the standard library only: without
# ``site`` (-S: no site-packages and none of its .pth files, 7 ms of CPU against 40 ms where
# site-packages is large, per host and per command) and unbuffered (-u). The probes that look
# for packages (the preflight's, the doctor's) start with site.
SCRIPT_FLAGS = ("-S", "-u")
SECRET_NAME_RE = re.compile(r"TOKEN|KEY|SECRET|PASSWORD", re.IGNORECASE)
MASK = "****"
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
PORT_RANGE = (20000, 40000)  # master ports are drawn from here, by a hash of the run id
# Set on every node unless the user sets them: without it, Python ranks block-buffer their
# output, and lines reach the files (and the user) only in blocks, or when the job ends.
DEFAULT_ENV = {"PYTHONUNBUFFERED": "1"}
# Where each backend's launcher writes every rank's output to a file of its own (DeepSpeed's
# --enable_each_rank_log, torchrun's --redirects with --log-dir), the node's watchdog relaying
# each file as whole tagged lines: one folder per node, since the run directory may be on a file
# system all nodes share. The files hold whatever the program printed (secrets included), so the
# watchdog removes the folder once it has relayed them (``cleanup`` in its header).
RANK_LOG_DIR = "{run_dir}/ranklogs/node%d"


@dataclass(frozen=True)
class NodeLaunch:
    """One node's share of a run: the command its watchdog starts and the environment it adds."""

    host: Host
    node_rank: int
    nproc: int
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    rank_log_dir: str = ""  # the folder of per-rank log files the watchdog relays
    backend: str = "torchrun"
    rank_offset: int | None = None  # global rank of local rank 0, where known before the start


def is_secret(name: str) -> bool:
    """Names that look like credentials are masked everywhere fstrain prints or records."""
    return bool(SECRET_NAME_RE.search(name))


def mask_env(env: Mapping[str, str]) -> dict[str, str]:
    return {key: (MASK if is_secret(key) else value) for key, value in env.items()}


def secret_values(env: Mapping[str, str], min_length: int = 4) -> list[str]:
    """Values of secret variables, longest first, for redaction of streamed output."""
    values = {v for k, v in env.items() if is_secret(k) and len(v) >= min_length}
    return sorted(values, key=len, reverse=True)


def redact(text: str, secrets: Sequence[str]) -> str:
    for value in secrets:
        if value in text:
            text = text.replace(value, MASK)
    return text


def parse_env_assignment(text: str, where: str) -> tuple[str, str]:
    """``K=V`` from ``--env`` or an env file line."""
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep:
        raise InputError(f"expected NAME=VALUE, got {text!r}", "write --env NAME=VALUE", where)
    if not _ENV_NAME_RE.match(name):
        raise InputError(f"{name!r} is not a valid environment variable name",
                         "names are letters, digits and '_', not starting with a digit", where)
    return name, value


def parse_env_file(text: str, path: str) -> dict[str, str]:
    """``NAME=VALUE`` lines (``export`` allowed, ``#`` comments, matching quotes stripped)."""
    env: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        if "\0" in line:  # no environment can hold it: every node's watchdog would fail
            raise InputError("NUL byte in an environment value", "remove it", f"{path}:{number}")
        name, value = parse_env_assignment(line, f"{path}:{number}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[name] = value
    return env


def master_port_candidates(run_id: str, count: int = 16) -> list[int]:
    """Ports to try for the rendezvous, starting from a stable hash of the run id, so two runs
    on the same hosts start from different ports; the launcher checks which one is free."""
    low, high = PORT_RANGE
    start = int(hashlib.sha256(run_id.encode()).hexdigest(), 16) % (high - low)
    return [low + (start + i) % (high - low) for i in range(count)]


def resolve_nproc(host: Host, requested: int | None, probed_gpus: int | None) -> int:
    """Processes on ``host``: an explicit ``--nproc-per-node``, else the hostfile's (selected)
    slots, else the GPUs a probe found."""
    if requested is not None:
        if requested < 1:
            raise InputError(f"--nproc-per-node must be 1 or more, got {requested}", "", "--nproc-per-node")
        if host.slot_ids is not None and requested != len(host.slot_ids):
            # DeepSpeed refuses a process count together with slot filters; so do we, unless
            # the two agree (never start N processes on fewer selected devices).
            raise InputError(
                f"--nproc-per-node {requested} contradicts --include/--exclude, which leave "
                f"{len(host.slot_ids)} slot(s) ({','.join(map(str, host.slot_ids))}) on {host.label()}",
                "drop --nproc-per-node (the selected slots set the process count), "
                "or select whole hosts with --include/--exclude",
                "--nproc-per-node",
            )
        return requested
    selected = host.num_selected_slots
    if selected is not None:
        return selected
    if probed_gpus:
        return probed_gpus
    raise ConfigError(
        f"cannot tell how many processes to start on {host.label()}: no slots in the inventory"
        + (" and no GPU found" if probed_gpus is not None else ""),
        "give --nproc-per-node N, slots=N in the hostfile, or --gpus-per-node"
        + ("" if probed_gpus is not None else " (a real launch counts the host's GPUs)"),
        host.where or host.label(),
    )


def base_env(env: Mapping[str, str]) -> dict[str, str]:
    """Every node's environment before its interface variables: fstrain's defaults, then the
    user's (what a prewarmed launcher's Python starts with)."""
    return {**DEFAULT_ENV, **env}


def launcher_prefix(backend: str, python: str) -> tuple[str, ...]:
    """The per-node launcher's command up to its module: what the watchdog can start (and let
    import torch) before the master address is known (``prewarm`` in the watchdog's header)."""
    if backend == "torchrun":
        return (python, "-m", "torch.distributed.run")
    return (python, "-u", "-m", "deepspeed.launcher.launch")


@dataclass(frozen=True)
class LaunchJob:
    """What every node runs and how the nodes meet: the same for all of them."""

    backend: str  # torchrun, deepspeed or direct
    program: Sequence[str]
    python: str  # the interpreter on the hosts
    master_addr: str
    master_port: int
    run_id: str
    max_restarts: int = 0  # torchrun worker-group restarts (0: the static rendezvous)
    env: Mapping[str, str] = field(default_factory=dict)  # the user's, for every rank
    no_local_rank: bool = False  # deepspeed: no --local_rank=N argument


def torchrun_argv(job: LaunchJob, *, nnodes: int, node_rank: int, nproc: int) -> tuple[str, ...]:
    """One ``torchrun`` per node. Without restarts, torchrun's static rendezvous: fstrain has
    already checked the master address and port, node ranks are fixed, so every global rank is
    known before the start (and the c10d rendezvous round is saved). With restarts, a c10d
    rendezvous at the master with a fresh rendezvous id per run, so nodes can rejoin."""
    python, master_addr, master_port, max_restarts = job.python, job.master_addr, job.master_port, job.max_restarts
    if max_restarts == 0:
        rendezvous = ["--rdzv-backend=static", f"--master-addr={master_addr}", f"--master-port={master_port}"]
    else:
        rendezvous = ["--rdzv-backend=c10d", f"--rdzv-endpoint={_host_port(master_addr, master_port)}"]
    return (
        *launcher_prefix("torchrun", python),
        f"--nnodes={nnodes}",
        f"--node-rank={node_rank}",  # informative under c10d (ranks come from the rendezvous)
        f"--nproc-per-node={nproc}",
        *rendezvous,
        f"--rdzv-id={job.run_id}",
        f"--max-restarts={max_restarts}",
        # Each rank's stdout and stderr to files of its own, relayed by the watchdog as whole
        # tagged lines (see RANK_LOG_DIR); torchrun's --tee relay forwards half lines.
        "--redirects=3",
        f"--log-dir={RANK_LOG_DIR % node_rank}",
        *_program_for_torchrun(python, job.program),
    )


def direct_argv(job: LaunchJob, *, nnodes: int, node_rank: int, nproc: int, rank_offset: int,
                world_size: int) -> tuple[str, ...]:
    """``--backend direct``: fstrain's own script starts the node's ``nproc`` ranks with the
    environment torchrun gives its workers (fstrain/io/remote/ranks.py). A Python program runs
    with the hosts' interpreter, as torchrun runs it."""
    program = list(job.program)
    if _is_python(program[0], job.python):
        program[0] = job.python
    elif program[0].endswith(".py"):
        program = [job.python, *program]
    return (
        job.python, *SCRIPT_FLAGS, "{run_dir}/" + DIRECT_SCRIPT,
        f"--nnodes={nnodes}", f"--node-rank={node_rank}", f"--nproc={nproc}", f"--rank-offset={rank_offset}",
        f"--world-size={world_size}", f"--master-addr={job.master_addr}", f"--master-port={job.master_port}",
        f"--run-id={job.run_id}", f"--log-dir={RANK_LOG_DIR % node_rank}", "--", *program,
    )


def _program_for_torchrun(python: str, program: Sequence[str]) -> list[str]:
    """torchrun runs ``python SCRIPT`` itself: map ``python -m mod`` to ``-m mod`` and other
    executables to ``--no-python``."""
    if _is_python(program[0], python):
        rest = list(program[1:])
        if rest[:1] == ["-m"] and len(rest) >= 2:
            return ["-m", *rest[1:]]
        if rest and not rest[0].startswith("-"):
            return rest
        if rest[:1] == ["-c"]:
            return ["--no-python", *program]
        raise InputError(f"cannot launch {' '.join(program)!r} per rank",
                         "give a script (python train.py ...) or a module (python -m pkg ...)", "PROGRAM")
    if program[0].endswith(".py"):
        return list(program)
    return ["--no-python", *program]


# Linux's limit on one argument of exec (include/uapi/linux/binfmts.h: MAX_ARG_STRLEN, 32 pages
# of 4 KiB), its terminating NUL included: an argument as long fails with E2BIG.
MAX_ARG_STRLEN = 131072


def encode_world_info(world_info: Mapping[str, Sequence[int]]) -> str:
    """DeepSpeed's ``--world_info``: base64 of the JSON of host -> slots. Every node's command
    line carries the whole world (DeepSpeed's launcher takes nothing else), so a launch sends
    N x N host entries; encoded once, not once per node."""
    return base64.urlsafe_b64encode(json.dumps(dict(world_info)).encode()).decode()


def check_world_info(encoded: str, nodes: int) -> None:
    """One line where the world no longer fits one argument of exec on the nodes."""
    size = len(f"--world_info={encoded}") + 1
    if size > MAX_ARG_STRLEN:
        raise InputError(f"the deepspeed backend's --world_info for {nodes:,} nodes is {size:,} bytes, and Linux "
                         f"takes at most {MAX_ARG_STRLEN:,} in one argument (MAX_ARG_STRLEN): DeepSpeed's "
                         "launcher cannot start", "launch with --backend torchrun (its command line does not grow "
                         "with the nodes), or fewer nodes", "--backend")


def deepspeed_argv(
    python: str, *, world_info: Mapping[str, Sequence[int]] | str, node_rank: int, master_addr: str,
    master_port: int, program: Sequence[str], no_local_rank: bool = False,
) -> tuple[str, ...]:
    """DeepSpeed's per-node launcher, as its multi-node runner starts it, but over our SSH.
    ``world_info``: host -> slots, or that encoded (:func:`encode_world_info`).

    As with the ``deepspeed`` command, every rank's program gets ``--local_rank=N`` appended
    unless ``no_local_rank`` (``--no-local-rank``; LOCAL_RANK is in the environment either way).
    """
    encoded = world_info if isinstance(world_info, str) else encode_world_info(world_info)
    head = [
        *launcher_prefix("deepspeed", python),
        f"--world_info={encoded}",
        f"--node_rank={node_rank}",
        f"--master_addr={master_addr}",
        f"--master_port={master_port}",
        # One file per rank, relayed by the watchdog as whole tagged lines (see RANK_LOG_DIR).
        f"--enable_each_rank_log={RANK_LOG_DIR % node_rank}",
    ]
    if no_local_rank:
        head.append("--no_local_rank")
    if _is_python(program[0], python):
        rest = list(program[1:])
        if rest[:1] == ["-m"] and len(rest) >= 2:
            return (*head, "--module", *rest[1:])
        if rest and not rest[0].startswith("-"):
            return (*head, *rest)
        if rest[:1] == ["-c"]:
            return (*head, "--no_python", *program)
        raise InputError(f"cannot launch {' '.join(program)!r} per rank",
                         "give a script (python train.py ...) or a module (python -m pkg ...)", "PROGRAM")
    if program[0].endswith(".py"):
        return (*head, *program)
    return (*head, "--no_python", *program)


def _is_python(executable: str, python: str) -> bool:
    name = executable.rsplit("/", 1)[-1]
    return executable == python or bool(re.fullmatch(r"python(\d+(\.\d+)?)?", name))


def _host_port(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def world_info(hosts: Sequence[Host], nprocs: Sequence[int]) -> dict[str, list[int]]:
    """DeepSpeed's world info: host -> local slot ids (the selected ones, where filtered)."""
    info: dict[str, list[int]] = {}
    for host, nproc in zip(hosts, nprocs, strict=True):
        info[host.name] = list(host.slot_ids) if host.slot_ids is not None else list(range(nproc))
    return info


def plan_launches(hosts: Sequence[Host], nprocs: Sequence[int], job: LaunchJob,
                  per_node_env: Sequence[Mapping[str, str]] = ()) -> list[NodeLaunch]:
    """Every node's command and environment (``job.env`` for all, ``per_node_env[i]`` for node i,
    which never overrides what the user set)."""
    backend, program, env = job.backend, job.program, job.env
    if backend not in BACKENDS:
        raise InputError(f"unknown backend {backend!r}", f"use one of {', '.join(BACKENDS)}", "--backend")
    if not program:
        raise InputError("no program to launch", "put the program after --: fstrain launch ... -- python train.py",
                         "PROGRAM")
    info = world_info(hosts, nprocs)
    encoded = encode_world_info(info) if backend == "deepspeed" else ""
    if backend == "deepspeed":
        check_world_info(encoded, len(hosts))
    # Global ranks follow node order (torchrun's static rendezvous, DeepSpeed's world info).
    static = backend != "torchrun" or job.max_restarts == 0
    launches = []
    offset = 0  # global rank of this node's local rank 0: a running sum, not a sum per node
    for rank, (host, nproc) in enumerate(zip(hosts, nprocs, strict=True)):
        node_env = {**(per_node_env[rank] if per_node_env else {}), **base_env(env)}
        if backend == "torchrun":
            argv = torchrun_argv(job, nnodes=len(hosts), node_rank=rank, nproc=nproc)
        elif backend == "direct":
            argv = direct_argv(job, nnodes=len(hosts), node_rank=rank, nproc=nproc, rank_offset=offset,
                               world_size=sum(nprocs))
        else:
            argv = deepspeed_argv(job.python, world_info=encoded, node_rank=rank, master_addr=job.master_addr,
                                  master_port=job.master_port, program=program, no_local_rank=job.no_local_rank)
        # Selected slots: CUDA_VISIBLE_DEVICES for the launchers that start every local device's
        # rank in order (DeepSpeed's takes them from its world info instead).
        if backend != "deepspeed" and host.slot_ids is not None and "CUDA_VISIBLE_DEVICES" not in env:
            node_env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, host.slot_ids))
        launches.append(NodeLaunch(host=host, node_rank=rank, nproc=nproc, argv=argv, env=node_env,
                                   rank_log_dir=RANK_LOG_DIR % rank,
                                   backend=backend, rank_offset=offset if static else None))
        offset += nproc
    return launches


