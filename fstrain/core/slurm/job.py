"""Slurm as values: the allocation read from ``SLURM_*``, per-node ``srun`` steps, the sbatch
script, and the parsers of ``scontrol``'s answers.

Pure: the edge (fstrain/io/slurm.py) runs srun, sbatch and scontrol; this module only builds
their argv and reads their output, so every rule here is tested without a cluster.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fstrain.core.hosts.hostfile import expand_hostlist
from fstrain.errors import InputError, InventoryError, ParseError

LAUNCHERS = ("auto", "ssh", "srun")
# Job states after which a job never runs again (squeue/scontrol JobState).
FINAL_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
    "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED",
})
SIGNAL_LEAD_S = 90  # the time-limit warning's lead, at most; a quarter of a shorter limit
# Slurm sends the warning up to a minute early (its timer's resolution): below 2 minutes a lead
# that leaves the job any time to run does not exist.
MIN_TIME_LIMIT_S = 120
CPUS_PER_RANK = 4  # a rank process and its data-loading workers; --cpus-per-rank changes it
# Each job of a batch script keeps its manifest, logs and summary in RUN_DIR/job-<job id>, so the
# script submitted again (sbatch FILE) never overwrites an earlier job's; the batch script marks
# the folder with TIME_LIMIT_MARKER when the time-limit warning (USR1) stops the run.
JOB_DIR_PREFIX = "job-"
TIME_LIMIT_MARKER = "time-limit"


def job_dir_name(job_id: str) -> str:
    return f"{JOB_DIR_PREFIX}{job_id}"
_TIME_RE = re.compile(r"^(\d+-)?\d+(:\d+){0,2}$|^(\d+-\d+)$|^(UNLIMITED|INFINITE|infinite|unlimited)$")
_GPU_COUNT_RE = re.compile(r"(?:^|[:/])(\d+)$")
MAX_LISTED_NODES = 8  # a message names this many nodes, then how many more: never a screenful
CANCELLED_BY_SLURM = "cancelled by Slurm (scancel)"
# Slurm ends a whole job when one of its nodes fails, unless it was allocated with --no-kill
# (then only the failed node's steps end, and fstrain's own steps run on the others).
NODE_FAILED = ("cancelled by Slurm: a node of the job failed, and the allocation was made without --no-kill, "
               "so Slurm ends the whole job; allocate with `salloc --no-kill` or `sbatch --no-kill` for a "
               "recovering run to go on on the other nodes")
_CANCEL_LINE_RE = re.compile(r"slurmstepd\S*: error: \*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT \S+"
                             r"(?: DUE (?:TO|to) (.+?))? \*\*\*")


@dataclass(frozen=True)
class Allocation:
    """The Slurm job fstrain runs inside: its id, its nodes in allocation order (node rank 0
    first: the rendezvous host), and the GPUs it holds per node (``None``: none requested)."""

    job_id: str
    nodes: tuple[str, ...]
    gpus_per_node: int | None = None

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)


def allocation_from_env(environ: Mapping[str, str]) -> Allocation | None:
    """The allocation of ``SLURM_JOB_ID`` + ``SLURM_JOB_NODELIST`` (expanded with our own
    host-list code), or ``None`` outside one."""
    job_id = environ.get("SLURM_JOB_ID", "").strip() or environ.get("SLURM_JOBID", "").strip()
    nodelist = environ.get("SLURM_JOB_NODELIST", "").strip() or environ.get("SLURM_NODELIST", "").strip()
    if not job_id or not nodelist:
        return None
    nodes = tuple(expand_hostlist(nodelist, "SLURM_JOB_NODELIST"))
    return Allocation(job_id, nodes, gpus_from_env(environ))


def check_one_task(environ: Mapping[str, str]) -> None:
    """``fstrain launch`` starts one step per node itself: inside an srun step of several tasks
    (``srun fstrain launch`` in a 2-node salloc runs it twice) every task would start a whole
    launch of its own. Refused before anything starts."""
    if not environ.get("SLURM_STEP_ID", "").strip():
        return  # a salloc shell or a batch script: not a step
    for name in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"):
        value = environ.get(name, "").strip()
        if value.isdigit():
            if int(value) > 1:
                raise InputError(f"this srun step runs {value} tasks ({name}={value}), and each would start a "
                                 "whole launch of its own", "run fstrain launch once, as one task: `srun -N1 -n1 "
                                 "--overlap fstrain launch ...`, or straight from the salloc shell or the batch "
                                 "script (it starts one step per node itself)", "srun")
            return


def list_nodes(nodes: Sequence[str]) -> str:
    """``n1, n2, n3``, or the first MAX_LISTED_NODES and how many more."""
    shown = ", ".join(nodes[:MAX_LISTED_NODES])
    more = len(nodes) - MAX_LISTED_NODES
    return f"{shown} and {more:,} more" if more > 0 else shown


def shorten(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def rejected_nodelist(name: str, value: str, why: str) -> InventoryError:
    """A node list that ``scontrol show hostnames`` cannot read (it says so on stderr, prints no
    host and still exits 0): one line naming the variable and its value."""
    said = next((line.strip() for line in why.splitlines() if line.strip()), "")
    said = said.removeprefix("scontrol: error: ")
    return InventoryError(f"Slurm cannot read {name}={shorten(value)!r}" + (f": {shorten(said, 120)}" if said else ""),
                          f"leave {name} as Slurm set it for the job (a node list such as node[01-04]), or name "
                          "the hosts with --hosts", name)


def job_nodes_note(job_id: str, ours: Sequence[str], job_nodes: Sequence[str]) -> str | None:
    """Inside an srun step ``SLURM_JOB_NODELIST`` is the step's (``srun --jobid=J -N1``), not
    the job's: one line when the job holds other nodes than it names (fstrain runs on the job's)."""
    if list(ours) == list(job_nodes):
        return None
    if set(ours) < set(job_nodes):
        return (f"this srun step holds {len(ours)} of Slurm job {job_id}'s {len(job_nodes)} nodes "
                f"({list_nodes(ours)}); fstrain runs on all of the job's: {list_nodes(job_nodes)}")
    return (f"SLURM_JOB_NODELIST names {list_nodes(ours)}, but Slurm job {job_id} holds {list_nodes(job_nodes)}; "
            "fstrain runs on the job's")


def ended_by_slurm(status: JobStatus | None) -> str | None:
    """Why Slurm itself is ending the job a run lives in, in the run's words: ``scancel`` makes
    it CANCELLED (COMPLETING first, while its processes end), and Slurm sends SIGTERM to every
    process of it (NODE_FAIL: a node failed in a job without ``--no-kill``); ``None`` while it
    runs."""
    if status is None:
        return None
    if status.state == "NODE_FAIL":
        return NODE_FAILED
    if status.state == "CANCELLED":
        return CANCELLED_BY_SLURM
    if status.state == "COMPLETING":
        return f"stopped by Slurm (job {status.job_id} is ending)"
    return None


def slurm_cancel_reason(line: str) -> str | None:
    """slurmstepd's own line on a node when Slurm cancels a step or the job: ``*** STEP 9.0 ON
    node1 CANCELLED AT 2026-12-01T18:13:04 ***`` (scancel), ``... DUE TO TIME LIMIT ***``, ``...
    DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***`` (on a node that did not fail: the
    job has no ``--no-kill``)."""
    match = _CANCEL_LINE_RE.search(line)
    if match is None:
        return None
    due = match.group(1)
    if due and due.upper().startswith("NODE FAILURE"):
        return NODE_FAILED
    return f"cancelled by Slurm ({due.lower()})" if due else CANCELLED_BY_SLURM


def gpus_from_env(environ: Mapping[str, str]) -> int | None:
    """GPUs per node Slurm gave the job: ``SLURM_GPUS_ON_NODE`` (set in the batch script and
    steps), ``SLURM_GPUS_PER_NODE`` (``--gpus-per-node``, maybe typed: ``h100:8``), the gres of
    ``SLURM_TRES_PER_NODE`` (``gres/gpu:8``), else the ids in ``SLURM_JOB_GPUS`` or, inside a
    step, ``CUDA_VISIBLE_DEVICES``. ``None`` when the job holds no GPU."""
    on_node = environ.get("SLURM_GPUS_ON_NODE", "").strip()
    if on_node.isdigit():
        return int(on_node) or None
    for name in ("SLURM_GPUS_PER_NODE", "SLURM_TRES_PER_NODE"):
        value = environ.get(name, "").strip()
        for part in value.split(","):
            if name == "SLURM_TRES_PER_NODE" and "gpu" not in part:
                continue
            match = _GPU_COUNT_RE.search(part.strip())
            if match and int(match.group(1)):
                return int(match.group(1))
    for name in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES") if environ.get("SLURM_STEP_ID") else ("SLURM_JOB_GPUS",):
        ids = [i for i in environ.get(name, "").split(",") if i.strip()]
        if ids and ids != ["NoDevFiles"]:
            return len(ids)
    return None


def plan_shape(allocation: Allocation, num_nodes: int | None, gpus_per_node: int | None) -> tuple[int, int | None]:
    """``fstrain plan --gpu G`` inside an allocation: the nodes and GPUs per node it holds, where
    --num-nodes/--gpus-per-node do not say otherwise."""
    return (num_nodes or allocation.num_nodes, gpus_per_node or allocation.gpus_per_node)


def check_hosts_in_job(chosen: Sequence[str], job_id: str, job_nodes: Sequence[str], flag: str) -> None:
    """Hosts given with --launcher srun must be the job's own nodes: srun reaches no other, and
    says so only late ("Requested node configuration is not available"). One line naming them
    and the job's nodes instead, before anything starts."""
    theirs = set(job_nodes)
    outside = [name for name in dict.fromkeys(chosen) if name not in theirs]
    if not outside:
        return
    verb = "is" if len(outside) == 1 else "are"
    raise InventoryError(f"{list_nodes(outside)} {verb} not in Slurm job {job_id}, whose nodes are "
                         f"{list_nodes(job_nodes)}: srun reaches only those",
                         "name the job's nodes, or reach other hosts over SSH with --launcher ssh", flag)


def check_hostnames(ours: Sequence[str], scontrol: Sequence[str]) -> str | None:
    """Compare our expansion of the node list with ``scontrol show hostnames``: ``None`` when
    they agree, else what differs (the launcher then trusts scontrol)."""
    if list(ours) == list(scontrol):
        return None
    return (f"SLURM_JOB_NODELIST expands to {list_nodes(ours)} here but to {list_nodes(scontrol)} "
            "with `scontrol show hostnames`")


def srun_step_argv(node: str, *, srun: str = "srun", extra: Sequence[str] = (),
                   cpus_per_task: int | None = None) -> list[str]:
    """The prefix that runs one command as a one-task job step on ``node`` of the current
    allocation: fstrain's per-node launcher, probe or check, instead of an SSH session.
    ``cpus_per_task``: the CPUs the job holds for its one task per node, passed on explicitly
    (srun 22.05 to 23.02 does not read SLURM_CPUS_PER_TASK: the step, and every rank in it,
    would otherwise be confined to one CPU where the site binds tasks to their cores)."""
    cpus = [f"--cpus-per-task={cpus_per_task}"] if cpus_per_task else []
    return [
        srun,
        "--nodes=1",  # this node only...
        "--ntasks=1",
        "--ntasks-per-node=1",  # ...one task on it: the per-node watchdog starts the ranks itself
        f"--nodelist={node}",
        "--kill-on-bad-exit=1",  # a failing task ends its step at once
        # Share the node with the other steps of the run (preflight, the rendezvous listener, the
        # job): by default a step waits until the resources of earlier steps are free.
        "--overlap",
        "--quiet",  # srun's own progress notes are not the job's output; its errors still show
        "--input=all",  # the watchdog's header and heartbeats arrive on stdin, as over SSH
        "--export=ALL",
        *cpus,
        *extra,
    ]


def cpus_per_task_from_env(environ: Mapping[str, str]) -> int | None:
    """``SLURM_CPUS_PER_TASK`` of the job (sbatch/salloc ``--cpus-per-task``), None when unset."""
    value = environ.get("SLURM_CPUS_PER_TASK", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def pyxis_args(container_image: str | None, container_mounts: str | None, *, name: str | None = None,
               default_mounts: Sequence[str] = ()) -> list[str]:
    """srun options of the Pyxis plugin (enroot containers): every node's step runs in them.
    ``name``: the container every step of the run shares (``--container-name``: Pyxis imports
    the image once per node and job, not once per step); ``default_mounts``: directories
    mounted at the same path after the user's own mounts (the working and run directories),
    unless the user mounts them already."""
    if container_mounts and not container_image:
        raise InputError("--container-mounts needs --container-image", "give the image to run in",
                         "--container-mounts")
    if not container_image:
        return []
    args = [f"--container-image={container_image}"]
    if name:
        args.append(f"--container-name={name}")
    mounts = [m for m in (container_mounts or "").split(",") if m]
    targets = {m.split(":")[1] if ":" in m else m for m in mounts}
    for path in default_mounts:
        if path not in targets and not any(path.startswith(t.rstrip("/") + "/") for t in targets):
            mounts.append(f"{path}:{path}")
            targets.add(path)
    if mounts:
        args.append(f"--container-mounts={','.join(mounts)}")
    return args


def parse_hostnames(text: str) -> list[str]:
    """``scontrol show hostnames`` output: one host per line."""
    return [line.strip() for line in text.splitlines() if line.strip()]


def parse_sbatch_job_id(text: str) -> str:
    """``sbatch --parsable`` prints ``JOBID`` or ``JOBID;CLUSTER``."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    job_id = first.split(";", 1)[0].strip()
    if not job_id.isdigit():
        raise ParseError(f"sbatch printed no job id: {text.strip()[:200]!r}", "run sbatch by hand to see why",
                         "sbatch")
    return job_id


# Pending reasons under which Slurm does not start the job as it was submitted, on the partition
# as it is configured (squeue(1), JOB REASON CODES): waiting changes nothing until someone changes
# the job or the partition. Reasons that can pass by themselves (Resources, Priority) are not here;
# PartitionNodeLimit counts only for more nodes than the partition has (it also means "its nodes
# are DOWN or DRAINED for now"). Slurm 22.05 says PartitionConfig at a 5-node job's first look on
# a 3-node partition, then PartitionNodeLimit.
NEVER_STARTS = {
    "PartitionConfig": "the partition cannot hold what it asks for (more nodes, CPUs or memory than it has)",
    "PartitionTimeLimit": "its time limit is beyond the partition's",
    "BadConstraints": "its constraints cannot be satisfied by any node",
    "InvalidAccount": "its account is not valid",
    "InvalidQOS": "its QOS is not valid",
}
# How long a job must stay pending for one of these before fstrain gives it up: the scheduler's
# first look at a new job, or an admin's `scontrol reconfigure`, can still change the reason.
NEVER_STARTS_AFTER_S = 10.0


def cannot_start(status: JobStatus, partition_nodes: int | None = None) -> str | None:
    """Why a pending job will never start as submitted (its reason and what it means), else None;
    ``partition_nodes``: how many nodes its partition has, where known."""
    if status.state != "PENDING":
        return None
    if status.reason == "PartitionNodeLimit" and status.num_nodes and partition_nodes is not None \
            and status.num_nodes > partition_nodes:
        where = f"partition {status.partition}" if status.partition else "its partition"
        return f"PartitionNodeLimit: it asks for {status.num_nodes} nodes and {where} has {partition_nodes}"
    if status.reason not in NEVER_STARTS:
        return None
    asked = f" ({status.num_nodes} nodes asked)" if status.num_nodes else ""
    return f"{status.reason}: {NEVER_STARTS[status.reason]}{asked}"


def parse_partition_nodes(text: str) -> int | None:
    """TotalNodes of ``scontrol show partition -o NAME``; None where it says none."""
    for word in text.split():
        key, _, value = word.partition("=")
        if key == "TotalNodes":
            return int(value) if value.isdigit() else None
    return None


@dataclass(frozen=True)
class JobStatus:
    """A job as ``scontrol show job -o`` describes it."""

    job_id: str
    state: str  # COMPLETED, RUNNING, ...
    exit_code: int  # the batch script's exit status
    signal: int  # the signal that ended it, 0 if none
    reason: str = ""  # why it waits (Priority, Resources, ...); empty where Slurm says None
    nodes: str = ""  # Slurm's node list expression, e.g. node[1-2]; empty while pending
    run_time_s: int | None = None  # RunTime: how long it has run (or ran)
    num_nodes: int | None = None
    time_limit: str = ""  # TimeLimit, as Slurm writes it (00:02:00, UNLIMITED)
    partition: str = ""

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def shell_exit_code(self) -> int:
        """As a shell reports it: the exit status, or 128+signal for a signal death."""
        return 128 + self.signal if self.signal else self.exit_code


def parse_scontrol_job(text: str) -> JobStatus:
    """One job of ``scontrol show job -o ID``: ``Key=Value`` words (values hold no spaces
    except in the last fields, which are not read)."""
    fields: dict[str, str] = {}
    for word in text.split():
        key, sep, value = word.partition("=")
        if sep and key not in fields:
            fields[key] = value
    if "JobId" not in fields or "JobState" not in fields:
        raise ParseError(f"not a job description: {text.strip()[:200]!r}", "", "scontrol show job")
    code, _, sig = fields.get("ExitCode", "0:0").partition(":")
    try:
        exit_code, signal = int(code), int(sig or 0)
    except ValueError:
        raise ParseError(f"unreadable ExitCode {fields.get('ExitCode')!r}", "", "scontrol show job") from None
    reason, nodes = fields.get("Reason", ""), fields.get("NodeList", "")
    num_nodes = fields.get("NumNodes", "").split("-")[0]  # a pending job's is a range: NumNodes=5-5
    return JobStatus(fields["JobId"], fields["JobState"], exit_code, signal, "" if reason == "None" else reason,
                     "" if nodes == "(null)" else nodes, parse_run_time_s(fields.get("RunTime", "")),
                     int(num_nodes) if num_nodes.isdigit() else None, fields.get("TimeLimit", ""),
                     fields.get("Partition", ""))


def parse_step_ids(text: str, job_id: str) -> list[str]:
    """The job's srun steps (``JOB.0``, ``JOB.1``, ...) in ``squeue -s -j JOB -h -o %i``; not its
    ``batch`` or ``extern`` step."""
    steps = []
    for line in text.split():
        job, _, step = line.partition(".")
        if job == job_id and step.isdigit():
            steps.append(line)
    return steps


def parse_run_time_s(text: str) -> int | None:
    """Slurm's elapsed time, ``[D-]HH:MM:SS`` (or ``MM:SS``), in seconds; None if unreadable."""
    days, _, clock = text.rpartition("-")
    parts = clock.split(":")
    if not clock or not all(p.isdigit() for p in parts) or len(parts) > 3 or (days and not days.isdigit()):
        return None
    seconds = 0
    for part in parts:
        seconds = seconds * 60 + int(part)
    return seconds + int(days or 0) * 86400


@dataclass(frozen=True)
class SbatchOptions:
    """What ``fstrain launch --slurm`` asks of sbatch; each becomes one ``#SBATCH`` line."""

    nodes: int
    job_name: str
    output: str  # the script's output file (%j: the job id)
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None  # the one per-node task's CPUs: every rank of the node runs in it
    partition: str | None = None
    time: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclusive: bool = False
    # A recovery policy: a node that fails leaves the others running, for the next attempt
    no_kill: bool = False
    signal: str | None = None  # default: USR1 to the script, a lead that fits the time limit
    extra: tuple[str, ...] = field(default_factory=tuple)  # --sbatch-arg, verbatim

    @property
    def time_limit_s(self) -> int | None:
        return time_limit_s(self.time) if self.time is not None else None

    @property
    def batch_signal(self) -> str:
        """``--signal``: as given, else USR1 to the batch script SIGNAL_LEAD_S before the time
        limit, or a quarter of the limit where that is shorter (never the whole limit)."""
        if self.signal is not None:
            return self.signal
        limit = self.time_limit_s
        return f"B:USR1@{SIGNAL_LEAD_S if limit is None else min(SIGNAL_LEAD_S, limit // 4)}"


def time_limit_s(text: str) -> int | None:
    """A Slurm ``--time`` in seconds (MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-HOURS,
    DAYS-HOURS:MINUTES, DAYS-HOURS:MINUTES:SECONDS); None for UNLIMITED or what is no time."""
    if not _TIME_RE.match(text) or text.lower() in ("unlimited", "infinite"):
        return None
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if days:  # DAYS-HOURS[:MINUTES[:SECONDS]]
        parts += [0] * (3 - len(parts))
        return int(days) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]
    if len(parts) == 3:
        return parts[0] * 3600 + parts[1] * 60 + parts[2]
    return parts[0] * 60 + (parts[1] if len(parts) == 2 else 0)


def check_sbatch_options(options: SbatchOptions) -> None:
    """The inputs sbatch would reject, rejected first, with the flag to fix."""
    if options.nodes < 1:
        raise InputError(f"--nodes must be 1 or more, got {options.nodes}", "", "--nodes")
    if options.gpus_per_node is not None and options.gpus_per_node < 1:
        raise InputError(f"--gpus-per-node must be 1 or more, got {options.gpus_per_node}", "", "--gpus-per-node")
    if options.cpus_per_task is not None and options.cpus_per_task < 1:
        raise InputError(f"the CPUs per node must be 1 or more, got {options.cpus_per_task}", "",
                         "--cpus-per-rank")
    if options.time is not None and not _TIME_RE.match(options.time):
        raise InputError(f"--time {options.time!r} is not a Slurm time",
                         "write MINUTES, HH:MM:SS or DAYS-HH[:MM[:SS]], e.g. 2:00:00", "--time")
    limit = options.time_limit_s
    if options.signal is None and limit is not None and limit < MIN_TIME_LIMIT_S:
        raise InputError(f"--time {options.time} is shorter than the {MIN_TIME_LIMIT_S // 60} minutes a batch "
                         "job of fstrain needs", "give --time 2 or more (Slurm may send the time-limit "
                         "warning up to a minute early, and the nodes need time to start)", "--time")
    for value in options.extra:
        if not value.startswith("-") or "\n" in value:
            raise InputError(f"--sbatch-arg {value!r} is not an sbatch option",
                             "give one option per --sbatch-arg, e.g. --sbatch-arg=--mail-type=END", "--sbatch-arg")
    for name in ("partition", "account", "qos", "constraint", "signal", "job_name"):
        value = getattr(options, name)
        flag = f"--{name.replace('_', '-')}"
        if value is not None and (not value or any(c.isspace() for c in value)):
            raise InputError(f"{flag} {value!r} must be one word", "", flag)


def render_sbatch(options: SbatchOptions, *, launch_argv: Sequence[str], workdir: str, run_id: str,
                  step_prefix: Sequence[str], run_dir: str, program: Sequence[str] = ()) -> str:
    """The batch script: resources, then one `fstrain launch --launcher srun` (``launch_argv``,
    then ``--run-dir`` the job's own folder under ``run_dir``, then ``-- program``) that starts a
    step per node, with the time-limit and cancel signals passed to it. Readable and reusable
    by hand (``sbatch FILE``: each job keeps its own records)."""
    check_sbatch_options(options)
    job_dir = shlex.quote(f"{run_dir}/{JOB_DIR_PREFIX}") + '"${SLURM_JOB_ID:?run this script with sbatch}"'
    launch_line = f'{shlex.join(launch_argv)} --run-dir "$job_dir"' + (f" -- {shlex.join(program)}" if program else "")

    def directive(flag: str, why: str) -> str:
        return f"#SBATCH {flag:<40} # {why}" if why else f"#SBATCH {flag}"

    lines = [
        "#!/bin/bash",
        f"# fstrain run {run_id}, written by `fstrain launch --slurm`. Submit it again by hand with",
        "#   sbatch THIS_FILE",
        "# sbatch reads the #SBATCH lines below (command-line options of sbatch win over them).",
        directive(f"--job-name={options.job_name}", "shown by squeue"),
        directive(f"--nodes={options.nodes}", "one fstrain node per Slurm node"),
        directive("--ntasks-per-node=1", "one per-node launcher; it starts the ranks"),
    ]
    if options.cpus_per_task is not None:
        lines.append(directive(f"--cpus-per-task={options.cpus_per_task}", "CPUs per node, for all its ranks"))
    if options.gpus_per_node is not None:
        lines.append(directive(f"--gpus-per-node={options.gpus_per_node}", "one rank per GPU"))
    for flag, value, why in (("partition", options.partition, ""), ("time", options.time, "the time limit"),
                             ("account", options.account, ""), ("qos", options.qos, ""),
                             ("constraint", options.constraint, "node features")):
        if value is not None:
            lines.append(directive(f"--{flag}={value}", why))
    if options.exclusive:
        lines.append(directive("--exclusive", "no other job on these nodes"))
    if options.no_kill:
        lines.append(directive("--no-kill", "a failed node does not end the job: the next attempt runs on the rest"))
    lines += [
        directive(f"--output={options.output}", "every rank's tagged lines and the summary"),
        directive(f"--signal={options.batch_signal}", "time nearly up: USR1 to this script (B:)"),
    ]
    lines += [directive(value, "") for value in options.extra]
    lines += [
        "",
        "set -u",
        f"cd {shlex.quote(workdir)}",
        "# This job's manifest, logs and summary: each submission of this file keeps its own.",
        f"job_dir={job_dir}",
        'mkdir -p "$job_dir"',
        "",
        "# fstrain starts one step per node, each running fstrain's watchdog and the per-node",
        "# launcher (torchrun or DeepSpeed's), no SSH:",
        f"#   {shlex.join(step_prefix)} PYTHON -u -c WATCHDOG",
        "# On `scancel` or at the time limit Slurm sends SIGTERM to every process of the job:",
        "# fstrain's watchdogs then stop every rank within --grace seconds (keep it below the",
        "# site's KillWait, after which Slurm sends SIGKILL). USR1, sent to this script alone",
        "# shortly before the time limit (--signal above), becomes that same SIGTERM, early, and",
        f"# the mark $job_dir/{TIME_LIMIT_MARKER} that has `fstrain status` name the time limit.",
        "pid=",
        "on_time_limit() {",
        '    echo "fstrain: the time limit of Slurm job $SLURM_JOB_ID is near: stopping the run"',
        f'    : > "$job_dir/{TIME_LIMIT_MARKER}"',
        '    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null',
        "}",
        "trap on_time_limit USR1",
        "trap ':' TERM  # fstrain has its own SIGTERM: keep waiting for its exit code",
        f"{launch_line} &",
        "pid=$!",
        "# `wait` returns early when a trapped signal arrives: wait until fstrain has exited.",
        "while :; do",
        "    wait \"$pid\"",
        "    code=$?",
        "    kill -0 \"$pid\" 2>/dev/null || break",
        "done",
        "exit \"$code\"",
        "",
    ]
    return "\n".join(lines)
