"""NCCL and Gloo environment: unknown ``NCCL_*`` names (with a did-you-mean), deprecated names,
invalid values, ``NCCL_TOPO_FILE`` missing or unreadable, a variable set differently on different
hosts. The environment is what a non-interactive SSH session gets, merged with NCCL's config
files (``NCCL_CONF_FILE`` or ``~/.nccl.conf``, then ``/etc/nccl.conf``) the way NCCL merges them."""

from __future__ import annotations

import difflib

from fstrain.core.doctor.facts import DoctorFacts, HostFacts, merged_env
from fstrain.core.doctor.ncclcatalogue import DEPRECATED, KNOWN_NAMES, MUST_MATCH, PER_HOST, value_problem
from fstrain.core.doctor.result import CheckResult, Finding, group, skipped
from fstrain.core.topo.ncclxml import parse_nccl_xml
from fstrain.errors import ParseError

ENV_FIX = "set it in the environment the jobs get (/etc/environment, or fstrain launch --env / --env-file)"


def _where(where: str) -> str:
    return "" if where == "environment" else f" (in {where})"


def suggestion(name: str) -> str | None:
    """The known NCCL variable ``name`` is most likely a typo of, if any is close enough."""
    close = difflib.get_close_matches(name, sorted(KNOWN_NAMES | set(DEPRECATED)), n=1, cutoff=0.8)
    return close[0] if close else None


def _nccl_names(host: HostFacts) -> dict[str, tuple[str, str]]:
    return {k: v for k, v in merged_env(host).items() if k.startswith("NCCL_")}


def check_unknown(facts: DoctorFacts) -> list[CheckResult]:
    if not facts.probed:
        return skipped("env.unknown", "no host was probed")
    findings = []
    for host in facts.probed:
        names = _nccl_names(host)
        unknown = [n for n in names if n not in KNOWN_NAMES and n not in DEPRECATED]
        for name in unknown:
            where = _where(names[name][1])
            guess = suggestion(name)
            if guess:
                findings.append(Finding(host.name, "fail", f"{name}{where} is not an NCCL variable: NCCL ignores it "
                                        f"(did you mean {guess}?)", f"rename it to {guess}"))
            else:
                findings.append(Finding(host.name, "warn", f"{name}{where} is not a variable NCCL 2.12-2.30 reads "
                                        "(a network plugin may read it)", "remove it unless a plugin needs it"))
        if not unknown:
            findings.append(Finding(host.name, "ok", "every NCCL_* variable is one NCCL reads"))
    return group("env.unknown", findings)


def check_deprecated(facts: DoctorFacts) -> list[CheckResult]:
    if not facts.probed:
        return skipped("env.deprecated", "no host was probed")
    findings = []
    for host in facts.probed:
        env = merged_env(host)
        old = [n for n in env if n in DEPRECATED]
        for name in old:
            new, why = DEPRECATED[name]
            both = f"; {new.split('=')[0]} is set too, and wins" if new and new.split("=")[0] in env else ""
            fix = f"use {new}={env[name][0]} instead" if new and "=" not in new else \
                f"use {new} instead" if new else "remove it"
            findings.append(Finding(host.name, "warn", f"{name}{_where(env[name][1])} is {why}{both}", fix))
        if not old:
            findings.append(Finding(host.name, "ok", "no deprecated name"))
    return group("env.deprecated", findings)


def check_values(facts: DoctorFacts) -> list[CheckResult]:
    if not facts.probed:
        return skipped("env.values", "no host was probed")
    findings = []
    for host in facts.probed:
        bad = 0
        for name, (value, where) in merged_env(host).items():
            problem = value_problem(name, value)
            if problem is not None:
                findings.append(Finding(host.name, "fail", problem[0] + _where(where), problem[1]))
                bad += 1
        if not bad:
            findings.append(Finding(host.name, "ok", "every value is one NCCL accepts"))
    return group("env.values", findings)


def check_topo_file(facts: DoctorFacts) -> list[CheckResult]:
    hosts = [h for h in facts.probed if "NCCL_TOPO_FILE" in merged_env(h)]
    if not hosts:
        return skipped("env.topo_file", "NCCL_TOPO_FILE is not set on any host")
    findings = []
    for host in hosts:
        path = merged_env(host)["NCCL_TOPO_FILE"][0]
        seen = host.files.get(path)
        fix = f"write it there (`fstrain topo xml -o {path}`), or unset NCCL_TOPO_FILE"
        if seen is None:
            findings.append(Finding(host.name, "skipped", f"NCCL_TOPO_FILE={path} was not checked"))
        elif not seen.readable:
            findings.append(Finding(host.name, "fail", f"NCCL_TOPO_FILE={path} cannot be read ({seen.error}): "
                                    "NCCL silently falls back to its own detection", fix))
        else:
            findings.append(_topo_text_finding(host.name, path, seen.text or "", fix))
    return group("env.topo_file", findings)


def _topo_text_finding(host: str, path: str, text: str, fix: str) -> Finding:
    try:
        root, _ = parse_nccl_xml(text, source=path)
    except ParseError as exc:
        return Finding(host, "fail", f"NCCL_TOPO_FILE={path}: NCCL cannot parse it: {exc.one_line()}", fix)
    count = sum(1 for _ in root.iter("gpu"))
    return Finding(host, "ok", f"NCCL_TOPO_FILE={path} is readable and parses ({count} GPUs)")


def check_consistency(facts: DoctorFacts) -> list[CheckResult]:
    hosts = facts.probed
    if len(hosts) < 2:
        return skipped("env.consistency", "fewer than two hosts probed", [h.name for h in hosts])
    envs = {h.name: merged_env(h) for h in hosts}
    names = sorted({n for env in envs.values() for n in env if _compared(n)})
    findings = []
    differing = set()
    for name in names:
        values = {host: env[name][0] if name in env else None for host, env in envs.items()}
        if len(set(values.values())) == 1:
            continue
        differing.add(name)
        verdict = "fail" if name in MUST_MATCH else "warn"
        for host, value in values.items():
            shown = f"{name}={value}" if value is not None else f"{name} is not set"
            findings.append(Finding(host, verdict, f"{shown}; hosts disagree on {name}",
                                    f"give {name} one value on every host: {ENV_FIX}"))
    if not differing:
        return [CheckResult("env.consistency", "ok", tuple(envs),
                            "NCCL_*, GLOO_*, TORCH_* and CUDA_* settings agree on every host")]
    return group("env.consistency", findings)


def _compared(name: str) -> bool:
    # per-host names (interfaces, HCAs, files) may differ; unknown and deprecated names are reported elsewhere
    if name in PER_HOST or name in DEPRECATED:
        return False
    return not name.startswith("NCCL_") or name in KNOWN_NAMES
