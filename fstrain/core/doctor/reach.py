"""Reachability: SSH connect and authentication per host, time to connect, clock skew."""

from __future__ import annotations

import statistics

from fstrain.core.doctor.facts import DoctorFacts, HostFacts
from fstrain.core.doctor.result import CheckResult, Finding, group, skipped

SLOW_CONNECT_S = 5.0  # a healthy SSH login takes well under a second; 5 s smells of DNS (UseDNS) or load
SKEW_WARN_S = 1.0  # logs of different hosts stop lining up; watchdog and timeout arithmetic drifts
SKEW_FAIL_S = 300.0  # Kerberos (5 min) and signed object-store requests (S3: 15 min) start failing


def split_hint(error: str) -> tuple[str, str]:
    """fstrain's one-line errors end in ``(hint: ...)``: the message and the hint apart."""
    message, sep, hint = error.partition(" (hint: ")
    return message, hint[:-1] if sep and hint.endswith(")") else hint


def reach_fix(host: str, error: str) -> str:
    _, hint = split_hint(error)
    leave_out = f"or leave it out: --exclude {host}"
    if "HOST KEY CHANGED" in error or "unknown host key" in error:
        return f"{hint}; {leave_out}" if hint else leave_out
    if "authentication failed" in error:
        return f"check the key and user for {host} (`ssh {host} true` must work without a password), {leave_out}"
    return f"check that {host} is up and its sshd runs (`ssh {host} true`), {leave_out}"


def check_connect(facts: DoctorFacts) -> list[CheckResult]:
    if facts.reached_through:
        return check_reached_through(facts, facts.reached_through)
    findings = []
    times = [h.connect_s for h in facts.hosts if h.reachable and h.connect_s is not None]
    span = "" if not times else f" in {min(times):.2f} s" if f"{min(times):.2f}" == f"{max(times):.2f}" else \
        f" in {min(times):.2f}-{max(times):.2f} s"
    for host in facts.hosts:
        if host.reach_error is not None:
            message, _ = split_hint(host.reach_error)
            findings.append(Finding(host.name, "fail", f"cannot connect: {message}",
                                    reach_fix(host.name, host.reach_error)))
        elif host.connect_s is not None and host.connect_s > SLOW_CONNECT_S:
            findings.append(Finding(host.name, "warn", f"SSH took {host.connect_s:.1f} s to connect and log in",
                                    "slow logins are usually reverse DNS: set `UseDNS no` in its sshd_config, "
                                    "or check the host's load"))
        else:
            findings.append(Finding(host.name, "ok", f"connected and authenticated{span}"))
    return group("ssh.connect", findings)


def check_reached_through(facts: DoctorFacts, path: str) -> list[CheckResult]:
    """Hosts reached another way than SSH (srun steps inside a Slurm allocation): no login
    happened, so the check says which path it took, and a node it could not reach is Slurm's
    to explain."""
    findings = []
    for host in facts.hosts:
        if host.reach_error is not None:
            message, _ = split_hint(host.reach_error)
            findings.append(Finding(host.name, "fail", f"cannot be reached through {path}: {message}",
                                    f"check the node's state in Slurm (`scontrol show node {host.name}`: DOWN, "
                                    f"DRAIN?), or leave it out: --exclude {host.name}"))
        else:
            findings.append(Finding(host.name, "ok", f"reached through {path} (no SSH login)"))
    return group("ssh.connect", findings)


def check_clock(facts: DoctorFacts) -> list[CheckResult]:
    measured = [h for h in facts.reached if h.clock_offset_s is not None]
    if len(measured) < 2:
        return skipped("clock.skew", "fewer than two hosts with a clock reading", [h.name for h in measured])
    reference = statistics.median(h.clock_offset_s for h in measured if h.clock_offset_s is not None)
    findings = [_skew_finding(h, reference) for h in measured]
    spread = max(abs(_off(h) - reference) for h in measured)
    return group("clock.skew", [f if f.verdict != "ok" else Finding(f.host, "ok", f"clocks agree within {spread:.2f} s")
                                for f in findings])


def _off(host: HostFacts) -> float:
    return host.clock_offset_s if host.clock_offset_s is not None else 0.0


def _skew_finding(host: HostFacts, reference: float) -> Finding:
    skew = _off(host) - reference
    slack = host.clock_uncertainty_s or 0.0  # half the round trip: the reading cannot be better
    size = abs(skew) - slack
    direction = "ahead of" if skew > 0 else "behind"
    fix = "run time synchronisation on every host (chrony or systemd-timesyncd: `timedatectl set-ntp true`)"
    if size > SKEW_FAIL_S:
        return Finding(host.name, "fail", f"clock is {abs(skew):.0f} s {direction} the other hosts", fix)
    if size > SKEW_WARN_S:
        return Finding(host.name, "warn", f"clock is {abs(skew):.1f} s {direction} the other hosts", fix)
    return Finding(host.name, "ok", "")
