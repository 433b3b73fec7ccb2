"""System: ``/dev/shm`` size, ``ulimit -n``, the checkpoint directory's free space, write
throughput and whether it is shared between hosts."""

from __future__ import annotations

from fstrain.core.doctor.facts import DoctorFacts, HostFacts
from fstrain.core.doctor.gpus import gpus
from fstrain.core.doctor.result import CheckResult, Finding, group, skipped

MIB, GIB = 1 << 20, 1 << 30
SHM_FAIL_BYTES = 512 * MIB  # NCCL's SHM transport and DataLoader workers; Docker's default 64 MiB fails
SHM_WARN_BYTES = 1 * GIB  # NVIDIA's containers ask for --shm-size=1g at least
NOFILE_WARN = 4096  # DataLoader workers share tensors through descriptors; TCPStore holds one per rank
SLOW_WRITE_MB_S = 100.0  # below this a 7B model's ~110 GB training checkpoint takes 20 minutes
SLOW_CHECKPOINT_S = 600.0  # with a plan: a checkpoint that stalls training this long each time


def check_shm(facts: DoctorFacts) -> list[CheckResult]:
    if not facts.probed:
        return skipped("sys.shm", "no host was probed")
    findings = []
    for host in facts.probed:
        shm = (host.report or {}).get("dev_shm")
        if not isinstance(shm, dict) or not shm.get("total_bytes"):
            findings.append(Finding(host.name, "fail", "/dev/shm is missing", "mount a tmpfs on /dev/shm"))
            continue
        total = int(shm["total_bytes"])
        fix = "give it more: `mount -o remount,size=16G /dev/shm`, or `docker run --shm-size=16g`"
        shown = f"/dev/shm is {total / MIB:.0f} MiB"
        if total < SHM_FAIL_BYTES and len(gpus(host)) >= 2:
            findings.append(Finding(host.name, "fail", f"{shown}: NCCL's shared-memory transport between its "
                                    "GPUs fails ('Error while creating shared memory segment')", fix))
        elif total < SHM_WARN_BYTES:
            findings.append(Finding(host.name, "warn", f"{shown}: DataLoader workers and NCCL may run out", fix))
        else:
            findings.append(Finding(host.name, "ok", "/dev/shm has at least 1 GiB"))
    return group("sys.shm", findings)


def check_nofile(facts: DoctorFacts) -> list[CheckResult]:
    if not facts.probed:
        return skipped("sys.nofile", "no host was probed")
    findings = []
    for host in facts.probed:
        limit = ((host.report or {}).get("ulimits") or {}).get("nofile") or {}
        soft, hard = limit.get("soft"), limit.get("hard")
        if isinstance(soft, int) and soft < NOFILE_WARN:
            fix = f"raise it in the job's shell: `ulimit -n {hard}`" if hard is None or hard > soft else \
                "`* soft nofile 1048576` and `* hard nofile 1048576` in /etc/security/limits.conf"
            findings.append(Finding(host.name, "warn", f"ulimit -n is {soft}: DataLoader workers and many ranks "
                                    "run out of file descriptors ('Too many open files')", fix))
        else:
            findings.append(Finding(host.name, "ok", f"ulimit -n is at least {NOFILE_WARN}"))
    return group("sys.nofile", findings)


# --- checkpoint directory --------------------------------------------------------------------


def _disk_hosts(facts: DoctorFacts) -> list[HostFacts]:
    return [h for h in facts.reached if h.disk is not None]


def check_ckpt_space(facts: DoctorFacts) -> list[CheckResult]:
    if not facts.checkpoint_dir:
        return skipped("ckpt.space", "--checkpoint-dir not given")
    need = facts.plan.checkpoint_bytes if facts.plan is not None else None
    findings = []
    roomy: dict[str, int] = {}  # host -> free bytes, reported together in one row
    for host in _disk_hosts(facts):
        disk = host.disk
        assert disk is not None
        if disk.error is not None or not disk.writable:
            findings.append(Finding(host.name, "fail", f"{disk.measured_at} is not writable: "
                                    f"{disk.error or 'permission denied'}",
                                    f"create it with the right owner: `mkdir -p {disk.path}`"))
            continue
        where = disk.path if disk.exists else f"{disk.path} (not there yet; measured at {disk.measured_at})"
        free = disk.free_bytes or 0
        if need and free < need:
            findings.append(Finding(host.name, "fail", f"{free / GIB:.1f} GiB free in {where}; one checkpoint of "
                                    f"the plan is {need / GIB:.1f} GiB", "free space or choose another directory"))
        elif need and free < 2 * need:
            findings.append(Finding(host.name, "warn", f"{free / GIB:.1f} GiB free in {where}: room for one "
                                    f"{need / GIB:.1f} GiB checkpoint, not for the next one beside it",
                                    "free space: keeping the last good checkpoint while writing needs two"))
        else:
            roomy[host.name] = free
    findings.extend(_roomy_findings(roomy, need))
    if not findings:
        return skipped("ckpt.space", "no host could be checked")
    return group("ckpt.space", findings)


def _roomy_findings(free_bytes_by_host: dict[str, int], need_bytes: int | None) -> list[Finding]:
    """One ok row for every host with room: free space moves between probes (other jobs write), and
    hosts that share a file system would otherwise split into rows a GiB apart."""
    if not free_bytes_by_host:
        return []
    low, high = (round(f(free_bytes_by_host.values()) / GIB) for f in (min, max))
    amount = f"{low} GiB" if low == high else f"{low}-{high} GiB"
    plan_note = f", at least two of the plan's {need_bytes / GIB:.1f} GiB checkpoints" if need_bytes else ""
    return [Finding(host, "ok", f"writable, {amount} free{plan_note}") for host in free_bytes_by_host]


def check_ckpt_throughput(facts: DoctorFacts) -> list[CheckResult]:
    if not facts.checkpoint_dir:
        return skipped("ckpt.throughput", "--checkpoint-dir not given")
    plan = facts.plan
    findings = []
    for host in _disk_hosts(facts):
        rate = host.disk.write_mb_per_s if host.disk is not None else None
        if rate is None:
            findings.append(Finding(host.name, "skipped", "no write could be timed"))
            continue
        shown = f"{rate:.0f} MB/s with fsync, all hosts writing at once"
        if plan is not None and plan.checkpoint_bytes:
            seconds = plan.checkpoint_bytes / plan.num_nodes / (rate * 1e6)
            verdict = "warn" if seconds > SLOW_CHECKPOINT_S else "ok"
            findings.append(Finding(host.name, verdict, f"{shown}: the plan's checkpoint takes about "
                                    f"{seconds / 60:.1f} min", "use faster storage, or save less often"
                                    if verdict == "warn" else ""))
        elif rate < SLOW_WRITE_MB_S:
            findings.append(Finding(host.name, "warn", shown + f" (below {SLOW_WRITE_MB_S:.0f} MB/s)",
                                    "use faster (local NVMe or parallel) storage for checkpoints"))
        else:
            findings.append(Finding(host.name, "ok", f"at least {SLOW_WRITE_MB_S:.0f} MB/s with fsync"))
    if not findings:
        return skipped("ckpt.throughput", "no host could be checked")
    return group("ckpt.throughput", findings)


def check_ckpt_shared(facts: DoctorFacts) -> list[CheckResult]:
    if not facts.checkpoint_dir:
        return skipped("ckpt.shared", "--checkpoint-dir not given")
    shared = facts.shared
    if shared is None:
        return skipped("ckpt.shared", "the marker test was not run")
    others = len(shared.seen_by) + len(shared.not_seen_by)
    if others == 0:
        return skipped("ckpt.shared", "one host: nothing to share with", [shared.writer])
    writer = shared.writer
    where = f" (in {shared.path})" if shared.path and shared.path != facts.checkpoint_dir else ""
    findings = [Finding(h, "skipped", f"could not look: {e}") for h, e in shared.errors.items()]
    if not shared.not_seen_by:
        findings += [Finding(h, "ok", f"shared: a marker written on {writer}{where} is seen by every host")
                     for h in (writer, *shared.seen_by)]
    elif not shared.seen_by:
        findings += [Finding(h, "warn", "not shared: each host has its own directory, so every host keeps only its "
                             "own shards and a resume must run on the same hosts",
                             "put checkpoints on shared storage (NFS, Lustre, ...) to resume anywhere")
                     for h in (writer, *shared.not_seen_by)]
    else:
        findings += [Finding(h, "ok", f"shared between these hosts (marker written on {writer}{where})")
                     for h in (writer, *shared.seen_by)]
        findings += [Finding(h, "fail", f"does not see the marker written on {writer}{where}: the directory is "
                             "shared by some hosts only, so shards end up split between file systems",
                             "mount the same file system at that path on every host") for h in shared.not_seen_by]
    return group("ckpt.shared", findings)
