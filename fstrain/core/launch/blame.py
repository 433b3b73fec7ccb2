"""Who is at fault for a failed attempt: evidence in, a verdict out.

The evidence is what the supervisor and the hang report already know about an attempt that
ended: the ranks that ended non-zero (with the last lines each printed), the hosts that stopped
answering, the host of the rank the stack or flight-recorder dumps show behind the others. The
verdict names a kind and the hosts to test:

- ``hardware``: the evidence points at a few hosts (fewer than half of them, or one). A host
  that stopped answering; a rank killed by SIGKILL (the OOM killer), SIGSEGV, SIGBUS or SIGILL;
  a GPU error (ECC, Xid, a GPU fallen off the bus); an NCCL/Gloo connection error seen on one
  host only (a lost peer makes every survivor report one: then they point at nobody); the host
  of the rank a stall shows behind. These hosts are suspects: a test
  (fstrain/api/diagnose.py) decides whether one is guilty, and only a guilty host is excluded.
- ``application``: the same Python exception (the same last traceback line, numbers aside) on
  ranks of two or more hosts, or on every failed rank of a one-host run, and nothing pointing
  at hardware. Restarting would fail the same way: the run ends without burning restarts.
- ``unknown``: no evidence, or evidence that disagrees (an exception on one host and a signal
  on another; different exceptions; more than half of the hosts implicated, which says more
  about the network or the job than about that many machines). The caller restarts without
  excluding; ``suspects`` still names the hosts the evidence touched, for a test.

Pure and stdlib only: values in, a value out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fstrain.core.launch.supervisor import FINISHED_REASON
from fstrain.core.monitor.rankexit import RankFailure

HARDWARE, APPLICATION, UNKNOWN = "hardware", "application", "unknown"
# A rank killed by one of these points at its host: the kernel's OOM killer (SIGKILL), memory
# or device faults (SIGSEGV, SIGBUS, SIGILL). SIGTERM, SIGINT and SIGABRT are how ranks are
# stopped (teardown, torchrun, NCCL's watchdog): consequences, not causes.
HOST_SIGNALS = ("SIGKILL", "SIGSEGV", "SIGBUS", "SIGILL")
# A GPU or driver fault in a rank's output (CUDA's and NVIDIA's own words).
_DEVICE_RE = re.compile(
    r"uncorrectable ECC|ECC error|\bXid\b|fallen off the bus|cudaErrorECCUncorrectable|"
    r"CUDA error: (?:unspecified launch failure|an illegal instruction|uncorrectable)|"
    r"NVML_ERROR|GPU is lost|CUDA-capable device\(s\) is/are busy or unavailable", re.IGNORECASE)
# A collective's transport failed: NCCL, Gloo and torch's own words for a lost peer.
_COMM_RE = re.compile(
    r"ncclRemoteError|ncclSystemError|NCCL (?:communicator was aborted|error)|"
    r"Connection (?:closed|reset) by peer|Connection refused|Broken pipe|"
    r"\[gloo|gloo/transport|DistNetworkError|DistBackendError|socket timeout|"
    r"remote process exited or there was a network error", re.IGNORECASE)
_TRACEBACK = "Traceback (most recent call last):"
# The interpreter's own one-line errors before any code runs (CPython's Modules/main.c and
# runpy): `python -m pkg.mod` of a module it cannot find, `python file.py` of a missing file.
# No traceback: the line is the whole story, and every rank prints the same one.
_STARTUP_RE = re.compile(
    r"^\S*python[\d.]*: (?:Error while finding module specification for '[^']+' \((?P<spec>\w+: .*)\)"
    r"|(?P<module>No module named \S+)"
    r"|(?P<file>can't open file .*))$")
# The last line of a traceback: 'ValueError: bad batch', 'torch.OutOfMemoryError: ...'.
_EXCEPTION_RE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Fault)\b(?::.*)?$")
# The rank tags before a rank's line: the launcher's ('[node2 r3] ', as the rank tails and
# `fstrain logs` keep them), the node relay's ('[local3]:'), torchrun's --tee ('[default3]:')
# and torch's own ('[rank3]: ', before a traceback's lines).
_TAG_RE = re.compile(r"^(?:(?:\[(?:default|rank|local)\d+\]:|\[[^\]\s]+ r\d+\])\s?)+")
_NUMBER_RE = re.compile(r"\d+")
# torchrun's own exception after a rank failed: the agent's, not the rank's.
_AGENT_EXCEPTIONS = ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError",)


@dataclass(frozen=True)
class RankEnd(RankFailure):
    """A rank that ended non-zero (the supervisor's RankFailure: rank, local rank, exit code
    as a shell reports it, host) and the last lines it printed, oldest first."""

    last_lines: tuple[str, ...] = ()

    @property
    def signal(self) -> str:
        """``SIGKILL`` for exit 137, "" when it did not die of a signal."""
        return self.signal_name

    @classmethod
    def of(cls, failure: RankFailure, host: str = "", last_lines: Iterable[str] = ()) -> RankEnd:
        """A RankFailure (torchrun's record, the watchdog's report) with its lines; ``host``
        where the failure does not name one."""
        return cls(failure.rank, failure.local_rank, failure.exit_code, failure.host or host, tuple(last_lines))

    @classmethod
    def from_record(cls, host: str, failure: Mapping[str, Any], last_lines: Iterable[str] = ()) -> RankEnd | None:
        """From the supervisor's ``NodeRecord.failure`` (``{"rank", "local_rank", "exit_code",
        "signal"}``, fstrain/core/launch/supervisor.py); None when it names no exit code."""
        code = failure.get("exit_code")
        if not isinstance(code, int) or isinstance(code, bool):
            return None
        rank, local = failure.get("rank"), failure.get("local_rank")
        return cls(rank if isinstance(rank, int) else None, local if isinstance(local, int) else None, code, host,
                   tuple(last_lines))


@dataclass(frozen=True)
class Evidence:
    """What an ended attempt left. ``failed``: the first failure, and every rank whose own
    output ends in a traceback or a fault (read from its log: a rank that raised on another
    host at the same step is evidence too, though its node was then torn down). Leave out the
    ends the teardown caused (SIGTERM, SIGKILL after the grace period): they are consequences,
    and a SIGKILL would read as the OOM killer's."""

    hosts: tuple[str, ...]  # the attempt's hosts, node rank order
    failed: tuple[RankEnd, ...] = ()  # ranks that ended non-zero (one per node is enough)
    lost_hosts: tuple[str, ...] = ()  # hosts that stopped answering (heartbeat/SSH lost)
    stalled_host: str | None = None  # the host of the rank the stack/flight-recorder dumps show behind
    first_failure_host: str | None = None
    stalled: bool = False  # the attempt ended as hung (--stall-timeout, --finish-timeout): its stacks were read


@dataclass(frozen=True)
class Verdict:
    kind: str  # "hardware" | "application" | "unknown"
    suspects: tuple[str, ...]  # hosts to test/exclude
    why: str  # one line for the record and the user


def strip_tag(line: str) -> str:
    return _TAG_RE.sub("", line.rstrip("\n"), count=1)


def last_exception(lines: Sequence[str]) -> str:
    """The exception line of the last Python traceback in ``lines`` ("" when there is none):
    the first line after ``Traceback (most recent call last):`` that looks like one."""
    text = [strip_tag(line) for line in lines]
    starts = [i for i, line in enumerate(text) if line.strip() == _TRACEBACK]
    if not starts:
        return startup_error(text)
    for line in text[starts[-1] + 1:]:
        if _EXCEPTION_RE.match(line.strip()) and not line.strip().startswith(_AGENT_EXCEPTIONS):
            return line.strip()
    return ""


def startup_error(lines: Sequence[str]) -> str:
    """The interpreter's own start-up error in ``lines`` ("" when there is none), as an
    exception line: ``ModuleNotFoundError: No module named 'fstrain'``."""
    for line in reversed(lines):
        match = _STARTUP_RE.match(line.strip())
        if match:
            if match.group("spec"):
                return match.group("spec")
            if match.group("module"):
                return f"ModuleNotFoundError: {match.group('module')}"
            return f"FileNotFoundError: {match.group('file')}"
    return ""


@dataclass(frozen=True)
class _Reading:
    """What one failed rank's end says: ``cause`` one of signal, device, comm, exception,
    unclear; ``detail`` the words behind it."""

    host: str
    cause: str
    detail: str


def read_end(end: RankEnd) -> _Reading:
    """Classify one failed rank. The order matters: a GPU fault or a signal outranks the
    exception it also raised; a connection error outranks the generic exception it becomes."""
    text = "\n".join(strip_tag(line) for line in end.last_lines)
    device = _DEVICE_RE.search(text)
    if device:
        return _Reading(end.host, "device", _line_of(text, device.start()))
    if end.signal in HOST_SIGNALS:
        return _Reading(end.host, "signal", f"{_who(end)} was killed by {end.signal}")
    comm = _COMM_RE.search(text)
    if comm:
        return _Reading(end.host, "comm", _line_of(text, comm.start()))
    exception = last_exception(end.last_lines)
    if exception:
        return _Reading(end.host, "exception", exception)
    return _Reading(end.host, "unclear", f"{_who(end)} exited with {end.exit_code}")


def _who(end: RankEnd) -> str:
    rank = f"rank {end.rank}" if end.rank is not None else "a rank"
    return f"{rank} on {end.host}" if end.host else rank


def _line_of(text: str, at: int) -> str:
    start = text.rfind("\n", 0, at) + 1
    end = text.find("\n", at)
    return text[start: end if end >= 0 else len(text)].strip()[:200]


def _same(exception: str) -> str:
    return _NUMBER_RE.sub("N", exception)


def blame(evidence: Evidence) -> Verdict:
    """The verdict on one attempt (see the module's docstring for the rules)."""
    hosts = evidence.hosts
    lost = tuple(h for h in hosts if h in set(evidence.lost_hosts)) or tuple(evidence.lost_hosts)
    if hosts and len(lost) == len(hosts) and len(hosts) > 1:
        return Verdict(UNKNOWN, (), f"every host ({len(hosts)}) stopped answering: the network between this "
                                    "machine and the hosts, not the hosts")
    readings = [read_end(end) for end in evidence.failed]
    pointers: dict[str, list[str]] = {}  # host -> why it is suspected, in the order found
    for host in lost:
        pointers.setdefault(host, []).append(f"{host} stopped answering")
    for reading in readings:
        if reading.cause in ("signal", "device"):
            pointers.setdefault(reading.host, []).append(reading.detail)
    comm_hosts = sorted({r.host for r in readings if r.cause == "comm"})
    if len(comm_hosts) == 1 and not pointers:
        host = comm_hosts[0]
        detail = next(r.detail for r in readings if r.host == host and r.cause == "comm")
        pointers.setdefault(host, []).append(f"a connection error on {host} only: {detail}")
    if evidence.stalled_host:
        pointers.setdefault(evidence.stalled_host, []).append(
            f"the stack dumps show {evidence.stalled_host}'s rank behind the others")
    exceptions = [r for r in readings if r.cause == "exception"]
    kinds = {_same(r.detail) for r in exceptions}
    exception_hosts = sorted({r.host for r in exceptions})
    suspects = _ordered(pointers, evidence.first_failure_host, hosts)

    if pointers:
        if exceptions and set(exception_hosts) - set(pointers):
            return Verdict(UNKNOWN, suspects,
                           f"conflicting evidence: {_said(pointers)}, but {exceptions[0].detail!r} on "
                           f"{_names(exception_hosts)}")
        limit = max(1, len(hosts) // 2)
        if len(pointers) > limit:
            return Verdict(UNKNOWN, suspects,
                           f"{len(pointers)} of {len(hosts)} hosts implicated ({_said(pointers)}): more likely "
                           "the network or the job than that many machines")
        return Verdict(HARDWARE, suspects, _said(pointers))
    if exceptions:
        if len(kinds) > 1:
            return Verdict(UNKNOWN, (), f"different exceptions on different ranks: "
                                        f"{'; '.join(sorted({r.detail for r in exceptions})[:3])}")
        one_host_run = len(hosts) <= 1 or len(exception_hosts) == len(set(hosts))
        if len(exception_hosts) >= 2 or one_host_run:
            ranks = len(exceptions)
            return Verdict(APPLICATION, (), f"the same exception on {ranks} rank{'s' if ranks != 1 else ''} of "
                                            f"{_names(exception_hosts)}: {exceptions[0].detail} (an error of "
                                            "the program: a restart would fail the same way)")
        host = exception_hosts[0]
        return Verdict(UNKNOWN, (host,), f"an exception on {host} only: {exceptions[0].detail}")
    if comm_hosts:
        return Verdict(UNKNOWN, (), f"connection errors on {_names(comm_hosts)}: each lost the others; "
                                    "nothing says who went first")
    if readings:
        first = evidence.first_failure_host
        return Verdict(UNKNOWN, (first,) if first else (),
                       f"{readings[0].detail}, with nothing in its output that says why")
    if evidence.stalled:
        return Verdict(UNKNOWN, (), "the run stalled, but its stacks show no host's rank behind the others "
                                    "(the other ranks had ended, or all wait alike): nothing names a host")
    return Verdict(UNKNOWN, (), "no evidence: no rank failed, no host was lost and no stall was seen")


def _ordered(pointers: Mapping[str, list[str]], first: str | None, hosts: Sequence[str]) -> tuple[str, ...]:
    """Suspects: the first failure's host first, then node rank order."""
    order = {host: i for i, host in enumerate(hosts)}
    return tuple(sorted(pointers, key=lambda h: (h != first, order.get(h, len(order)), h)))


def _said(pointers: Mapping[str, list[str]]) -> str:
    return "; ".join(why for whys in pointers.values() for why in dict.fromkeys(whys))


def _names(hosts: Sequence[str]) -> str:
    return ", ".join(hosts) if len(hosts) <= 4 else f"{', '.join(hosts[:4])} and {len(hosts) - 4} more"


def stalled_host(hang: Mapping[str, Any], hosts: Sequence[str]) -> str | None:
    """The host the hang report (fstrain/core/monitor/stacks.py's ``hang_report`` document)
    shows behind: the host of the ranks the flight recorders show behind, else of the ranks
    whose stacks differ from the others'. None when those ranks are on several hosts, or when
    every rank is odd (no two agree: nothing stands out)."""
    node_of = hang.get("node_of_rank") or {}
    where = hang.get("where") or {}
    behind = [int(r) for r in hang.get("flight_recorder_behind") or []]
    odd = [int(r) for r in hang.get("odd_ranks") or []]
    after_finish = str(hang.get("reason", "")).startswith(FINISHED_REASON)  # the live ranks are the late ones
    if not behind and not after_finish and (not odd or hang.get("common") is None or len(odd) >= len(where)):
        return None
    nodes = {node_of.get(str(rank)) for rank in (behind or odd)}
    if len(nodes) != 1:
        return None
    node = nodes.pop()
    return hosts[node] if isinstance(node, int) and 0 <= node < len(hosts) else None
