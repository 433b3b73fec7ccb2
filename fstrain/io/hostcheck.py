"""A launch's checks of its hosts before anything starts on them: the preflight (interpreter,
packages, working directory, network facts) and the rendezvous (an address of the first host
that every host reaches, on a port free there), in one SSH session per host.

:func:`check_hosts` is a launch's path: the first host opens a listener on a free port and
names its addresses (netcheck's ``listen``), then every host, in one session, reports its facts
and connects to each of those addresses (netcheck's ``probe``): a session and a Python start
per host fewer than the two stages apart, which cost 110 ms of a host's CPU where the probe
costs 55 (measured on namespace hosts). Where the first host's listener cannot start (the host
unreachable, its interpreter missing, no free port) the stages run apart, :func:`preflight`
then :func:`choose_rendezvous`, so the error names every host's problem as it always did.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from fstrain.core.hosts.hostfile import Host, compress_hostlist
from fstrain.core.job.spec import SCRIPT_FLAGS, master_port_candidates
from fstrain.errors import FstrainError
from fstrain.io.connect import is_local
from fstrain.io.fanout import HostPool, HostResult
from fstrain.io.launch import HostFacts, LaunchError, Rendezvous
from fstrain.io.listener import start_listener
from fstrain.io.remote import source

# -- 1. preflight -------------------------------------------------------------------------------


# The ranks of --model/--recipe/--plan run `python -m fstrain.train` in the working directory.
BUNDLED_TRAINER_HINT = ("install fstrain on every host (pip install fstrain, the version here), or run from a "
                        "folder every host sees that holds fstrain's checkout (--workdir), or pass --python "
                        "with an interpreter that has it")


def package_hint(package: str, python: str) -> str | None:
    """What to do where the interpreter lacks only ``package``, for the packages a flag of the
    bundled trainer asks for; None for the rest (:func:`interpreter_hint` then)."""
    if package == "fstrain":
        return BUNDLED_TRAINER_HINT
    if package == "tensorboard":  # --tensorboard: the trainer's SummaryWriter imports it
        return (f"{python} -m pip install tensorboard on those hosts (or pip install 'fstrain[tensorboard]'), "
                "or leave out --tensorboard")
    return None


def missing_packages(info: Mapping[str, Any], packages: Sequence[str]) -> list[str]:
    """Which of ``packages`` a host's ``info`` (netcheck's) says its interpreter cannot import:
    neither an installed version (torch, deepspeed) nor a place it imports from in the working
    directory."""
    found = info.get("importable") or {}
    return [name for name in packages if not (info.get(name) or found.get(name))]


def preflight(pool: HostPool, python: str, workdir: str | None, timeout_s: float = 60,
              packages: Sequence[str] = (), workdir_is_default: bool = False) -> list[HostFacts]:
    """Check every host's interpreter, its ``packages`` and the working directory; raise one
    error naming each bad host."""
    argv = [python, "-", "info", workdir or "", *packages]
    results = pool.run_all(argv, stdin=source("netcheck").encode(), timeout_s=timeout_s)
    return preflight_facts(pool, python, workdir, results, packages, workdir_is_default, timeout_s)


def preflight_facts(pool: HostPool, python: str, workdir: str | None, results: Sequence[HostResult],
                    packages: Sequence[str], workdir_is_default: bool, timeout_s: float) -> list[HostFacts]:
    """Each host's facts from its session's answer (netcheck's ``info`` or ``probe``); raise one
    error naming each bad host."""
    problems: list[str] = []
    facts: list[HostFacts] = []
    hint = "fix the hosts above (--python, --workdir) or leave them out with --exclude"
    for host, result in zip(pool.hosts, results, strict=True):
        if result.error:
            # The pool's text carries the transport's own hint: keep one hint in the one error line.
            message, _, own_hint = result.error.partition(" (hint: ")
            problems.append(f"{host.label()}: {message}")
            hint = own_hint.removesuffix(")") or hint
            continue
        if result.exit_code == 127:
            problems.append(f"{host.label()}: interpreter {python!r} not found")
            continue
        try:
            info = json.loads(result.stdout)
        except json.JSONDecodeError:
            problems.append(f"{host.label()}: {python} could not run the check: {result.stderr.strip()[-300:]}")
            continue
        if not info.get("workdir_exists", True):
            where = " (the current directory here, the default)" if workdir_is_default else ""
            problems.append(f"{host.label()}: working directory {workdir!r}{where} does not exist")
            if workdir_is_default:
                hint = "run fstrain from a directory that exists on every host, or pass --workdir DIR"
            continue
        missing = missing_packages(info, packages)
        if missing:
            problems.append(f"{host.label()}: {python} ({info.get('python_executable')}, Python "
                            f"{info.get('python')}) cannot import {' or '.join(missing)}")
            own = package_hint(missing[0], python) if len(missing) == 1 else None
            hint = own or interpreter_hint(pool, python, packages, timeout_s)
            continue
        facts.append(HostFacts(host, info, result.seconds))
    if problems:
        raise LaunchError("preflight failed on " + summarize_problems(problems), hint, "launch")
    return facts


PROBLEMS_SHOWN = 5  # hosts named with their problem in the one error line; the rest by name only


def summarize_problems(problems: Sequence[str]) -> str:
    """The first PROBLEMS_SHOWN hosts' problems (each ``host: what``), then the other failed
    hosts as one compressed list (``node[6-200]``): at 200 failed hosts the line stays a line."""
    shown = "; ".join(problems[:PROBLEMS_SHOWN])
    rest = [problem.split(": ", 1)[0] for problem in problems[PROBLEMS_SHOWN:]]
    return shown if not rest else f"{shown}; and {len(rest)} more hosts ({compress_hostlist(rest)})"


def interpreter_hint(pool: HostPool, python: str, packages: Sequence[str], timeout_s: float) -> str:
    """Which --python to pass: the interpreter running fstrain here, if every host has it with
    ``packages`` (a venv or conda environment on shared storage), else how to find one."""
    local = sys.executable
    generic = (f"pass --python with the path of an interpreter that has {' and '.join(packages)} on every "
               "host (a venv's or conda environment's bin/python)")
    if not local or local == python:
        return generic
    results = pool.run_all([local, "-", "info", "", *packages], stdin=source("netcheck").encode(),
                           timeout_s=timeout_s)
    for result in results:
        try:
            info = json.loads(result.stdout) if result.ok else {}
        except json.JSONDecodeError:
            info = {}
        if missing_packages(info, packages):
            return generic
    return f"pass --python {local} (the interpreter running fstrain here has them on every host)"


# -- 2. rendezvous ------------------------------------------------------------------------------


# A host's reachability check may take this long beyond its connection attempts, or twice what
# the slowest host's preflight session took, whichever is longer: a session's time is mostly the
# hosts' and this machine's load (`--fanout` sessions at once, each a login shell and a Python
# start), and a launch must not fail because its hosts are busy, only because one hangs.
CHECK_MARGIN_S = 30.0


def check_timeout_s(connect_timeout_s: float, targets: int, facts: Sequence[HostFacts]) -> float:
    """The reachability check's time limit on each host (see CHECK_MARGIN_S)."""
    slowest = max((f.session_s for f in facts), default=0.0)
    return connect_timeout_s * targets + max(CHECK_MARGIN_S, 2 * slowest)


def choose_rendezvous(pool: HostPool, facts: Sequence[HostFacts], python: str, run_id: str,
                      master_port: int | None, timeout_s: float = 10) -> Rendezvous:
    """The first host's address that every host reaches, on a port that is free there
    (``timeout_s``: each connection attempt's limit)."""
    hosts = [f.host for f in facts]
    ports = rendezvous_ports(run_id, master_port)
    candidates = rendezvous_candidates(hosts, facts[0].info["interfaces"])
    if not candidates:
        raise LaunchError(f"{hosts[0].label()} has no network address other hosts could use",
                          "check its interfaces with `ip addr`", "rendezvous")
    try:
        listening = start_listener(pool.open_transport(hosts[0]), python, ports)
    except ValueError as exc:
        raise LaunchError(f"the rendezvous listener on {hosts[0].label()} answered no port: {exc}", "",
                          "rendezvous") from None
    try:
        port = listening.port
        if port is None:
            raise LaunchError(f"no free rendezvous port on {hosts[0].label()} (tried {ports})",
                              "pass --master-port with a free port", "rendezvous")
        targets = [f"{address}:{port}" for address in candidates]
        results = pool.run_all([python, *SCRIPT_FLAGS, "-", "connect", str(timeout_s), *targets],
                               stdin=source("netcheck").encode(),
                               timeout_s=check_timeout_s(timeout_s, len(targets), facts))
    finally:
        listening.close()
    reach: list[dict[str, dict[str, Any]]] = []
    for host, result in zip(hosts, results, strict=True):
        if not result.ok:
            raise LaunchError(f"{host.label()} could not run the reachability check: {result.error or result.stderr}",
                              "", "rendezvous")
        reach.append({r["target"]: r for r in json.loads(result.stdout)})
    return reached(hosts, targets, candidates, int(port), reach)


def rendezvous_ports(run_id: str, master_port: int | None) -> list[int]:
    """The ports the listener tries, in order: ``--master-port`` alone, or the run id's own."""
    return [master_port] if master_port else master_port_candidates(run_id)


def rendezvous_candidates(hosts: Sequence[Host], interfaces: Sequence[Mapping[str, Any]]) -> list[str]:
    """The first host's addresses the others may reach it on (loopback where every host is this
    machine), from its IPv4 interfaces (netcheck's)."""
    if all(is_local(h) for h in hosts):
        return ["127.0.0.1"]
    return [i["address"] for i in interfaces if not i["address"].startswith("127.") and i["state"] in ("up", "unknown")]


def reached(hosts: Sequence[Host], targets: Sequence[str], candidates: Sequence[str], port: int,
            reach: Sequence[Mapping[str, Mapping[str, Any]]]) -> Rendezvous:
    """The first candidate every host connected to (``reach``: per host, each target's result),
    with the interface each host reached it through; else an error naming who reaches what not."""
    for target, address in zip(targets, candidates, strict=True):
        if all(r[target]["ok"] for r in reach):
            interfaces = tuple(str(r[target].get("interface") or "") for r in reach)
            return Rendezvous(address, port, interfaces)
    detail = "; ".join(f"{h.label()} cannot reach " + ", ".join(t for t, e in r.items() if not e["ok"])
                       for h, r in zip(hosts, reach, strict=True) if not all(e["ok"] for e in r.values()))
    raise LaunchError(f"no address of {hosts[0].label()} is reachable from every host: {detail}",
                      "check routes and firewalls, or run `fstrain doctor`", "rendezvous")


# -- both in one session per host --------------------------------------------------------------


def check_hosts(pool: HostPool, python: str, workdir: str | None, run_id: str, master_port: int | None, *,
                packages: Sequence[str] = (), workdir_is_default: bool = False, timeout_s: float = 60,
                connect_timeout_s: float = 10) -> tuple[list[HostFacts], Rendezvous]:
    """Every host's facts (as :func:`preflight`) and the rendezvous (as
    :func:`choose_rendezvous`), one session per host; raise the error either stage would."""
    hosts = pool.hosts

    def apart() -> tuple[list[HostFacts], Rendezvous]:
        facts = preflight(pool, python, workdir, timeout_s, packages, workdir_is_default)
        return facts, choose_rendezvous(pool, facts, python, run_id, master_port, connect_timeout_s)

    try:
        listening = start_listener(pool.open_transport(hosts[0]), python, rendezvous_ports(run_id, master_port))
    except (FstrainError, ValueError):
        return apart()
    try:
        port = listening.port
        candidates = rendezvous_candidates(hosts, listening.opened.get("interfaces") or [])
        if port is None or not candidates:
            listening.close()
            return apart()
        targets = [f"{address}:{port}" for address in candidates]
        probe = [python, "-", "probe", workdir or "", str(connect_timeout_s), *targets, "--", *packages]
        results = pool.run_all(probe, stdin=source("netcheck").encode(),
                               timeout_s=timeout_s + connect_timeout_s * len(targets))
    finally:
        listening.close()
    facts = preflight_facts(pool, python, workdir, results, packages, workdir_is_default, timeout_s)
    reach = [{r["target"]: r for r in fact.info.pop("reach", [])} for fact in facts]
    return facts, reached(hosts, targets, candidates, port, reach)
