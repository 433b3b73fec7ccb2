"""Reachability, clock, system, checkpoint and orphan checks; grouping, verdicts, the catalogue."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from fstrain.core.doctor import CHECKS, IDS, exit_code, run_checks, select, stages, summary
from fstrain.core.doctor.facts import DiskFacts, DoctorFacts, HostFacts, PlanNeeds, RunRecord, SharedDir
from fstrain.core.doctor.plan import checkpoint_bytes
from fstrain.core.doctor.result import CheckResult, Finding, group
from fstrain.errors import InputError
from tests.unit.doctor_reports import facts, host, minimal_report

DOCS = Path(__file__).resolve().parents[2] / "docs" / "doctor.md"
# The transport's own messages (fstrain/io/transport/ssh.py), as HostPool hands them over.
REFUSED = "cannot connect to 198.18.0.13:22: Connection refused (hint: is the host up and sshd running?)"
CHANGED = ("HOST KEY CHANGED for 198.18.0.12: known_hosts has ssh-ed25519 SHA256:abc, the host sent ssh-ed25519 "
           "SHA256:def (hint: if the host was reinstalled, run `ssh-keygen -R 198.18.0.12` and connect again)")


def run(check_id: str, doctor: DoctorFacts) -> dict[tuple[str, ...], tuple[str, str, str]]:
    return {r.hosts: (r.verdict, r.message, r.fix) for r in run_checks(doctor, select(check_id))}


def test_grouping_merges_identical_hosts_worst_first() -> None:
    rows = group("x", [Finding("a", "ok", "fine"), Finding("b", "fail", "bad", "fix it"), Finding("c", "ok", "fine"),
                       Finding("d", "warn", "meh")])
    assert rows == [CheckResult("x", "fail", ("b",), "bad", "fix it"), CheckResult("x", "warn", ("d",), "meh"),
                    CheckResult("x", "ok", ("a", "c"), "fine")]


@pytest.mark.parametrize(("verdicts", "code"), [(["ok", "skipped"], 0), (["ok", "warn"], 1), (["warn", "fail"], 2),
                                                ([], 0)])
def test_exit_codes(verdicts: list[str], code: int) -> None:
    results = [CheckResult(f"c{i}", v, (), "") for i, v in enumerate(verdicts)]
    assert exit_code(results) == code
    assert summary(results)["exit_code"] == code


def test_summary_counts_each_check_once_by_its_worst_row() -> None:
    results = [CheckResult("a", "ok", ("h1",), ""), CheckResult("a", "fail", ("h2",), ""),
               CheckResult("b", "skipped", (), "")]
    assert summary(results) == {"checks": 2, "ok": 0, "skipped": 1, "warn": 0, "fail": 1, "verdict": "fail",
                                "exit_code": 2}


def test_selection_by_id_and_family() -> None:
    assert [c.id for c in select("gpu.ecc,net.mtu")] == ["net.mtu", "gpu.ecc"]
    assert all(c.id.startswith("gpu.") for c in select("gpu"))
    assert "gpu.ecc" not in [c.id for c in select(skip="gpu")]
    with pytest.raises(InputError, match=r"did you mean gpu\.ecc"):
        select("gpu.ec")
    with pytest.raises(InputError, match="no check is left"):
        select("gpu", "gpu")
    assert stages(select("ssh.connect")) == {"connect"}
    assert stages(select("net.rendezvous_port")) == {"connect", "interfaces", "rendezvous"}


def test_every_check_is_documented() -> None:
    text = DOCS.read_text()
    documented = set(re.findall(r"^### `([a-z]+\.[a-z_]+)`", text, re.M))
    assert documented == set(IDS)


def test_every_check_survives_hosts_that_could_not_be_reached_or_probed() -> None:
    doctor = facts(HostFacts("down", reach_error=REFUSED), HostFacts("noprobe", probe_error="exit 1"),
                   host("ok", minimal_report("ok")), checkpoint_dir="/ckpt", workdir="/w")
    results = run_checks(doctor, CHECKS)
    assert {r.id for r in results} == set(IDS)
    assert not [r for r in results if "down" in r.hosts and r.id != "ssh.connect"]


def test_unreachable_and_changed_key_hosts_fail_with_their_fix() -> None:
    doctor = facts(HostFacts("node1", connect_s=0.05), HostFacts("node2", reach_error=CHANGED),
                   HostFacts("node3", reach_error=REFUSED))
    result = run("ssh.connect", doctor)
    assert result[("node1",)] == ("ok", "connected and authenticated in 0.05 s", "")
    verdict, message, fix = result[("node2",)]
    assert (verdict, message) == ("fail", CHANGED.replace("HOST", "cannot connect: HOST", 1).split(" (hint:")[0])
    assert fix == ("if the host was reinstalled, run `ssh-keygen -R 198.18.0.12` and connect again; or leave it out: "
                   "--exclude node2")
    assert result[("node3",)] == ("fail", "cannot connect: cannot connect to 198.18.0.13:22: Connection refused",
                                  "check that node3 is up and its sshd runs (`ssh node3 true`), or leave it out: "
                                  "--exclude node3")
    slow = run("ssh.connect", facts(HostFacts("s", connect_s=7.5)))
    assert slow[("s",)][:2] == ("warn", "SSH took 7.5 s to connect and log in")


def test_hosts_reached_through_srun_say_so_and_not_ssh() -> None:
    doctor = facts(HostFacts("node1", connect_s=0.4), HostFacts("node3", reach_error="srun: error: node3 is DOWN"),
                   reached_through="srun in Slurm job 14")
    result = run("ssh.connect", doctor)
    assert result[("node1",)] == ("ok", "reached through srun in Slurm job 14 (no SSH login)", "")
    assert result[("node3",)] == ("fail", "cannot be reached through srun in Slurm job 14: srun: error: node3 is DOWN",
                                  "check the node's state in Slurm (`scontrol show node node3`: DOWN, DRAIN?), or "
                                  "leave it out: --exclude node3")


def test_clock_skew() -> None:
    doctor = facts(HostFacts("a", clock_offset_s=0.01, clock_uncertainty_s=0.002),
                   HostFacts("b", clock_offset_s=0.02, clock_uncertainty_s=0.002),
                   HostFacts("c", clock_offset_s=42.0, clock_uncertainty_s=0.002),
                   HostFacts("d", clock_offset_s=-900.0, clock_uncertainty_s=0.002))
    result = run("clock.skew", doctor)
    assert result[("c",)][:2] == ("warn", "clock is 42.0 s ahead of the other hosts")
    assert result[("d",)][:2] == ("fail", "clock is 900 s behind the other hosts")
    assert "timedatectl set-ntp true" in result[("d",)][2]
    fine = run("clock.skew", facts(HostFacts("a", clock_offset_s=0.0), HostFacts("b", clock_offset_s=0.3)))
    assert fine[("a", "b")][:2] == ("ok", "clocks agree within 0.15 s")


def _with(report_fields: dict[str, Any], name: str = "h") -> HostFacts:
    return host(name, minimal_report(name, **report_fields))


def test_dev_shm_and_nofile() -> None:
    small = {"total_bytes": 64 << 20, "free_bytes": 64 << 20}
    result = run("sys.shm", facts(_with({"dev_shm": small}, "docker"), _with({}, "fine")))
    assert result[("docker",)][:2] == ("warn", "/dev/shm is 64 MiB: DataLoader workers and NCCL may run out")
    assert "--shm-size" in result[("docker",)][2]
    assert result[("fine",)][0] == "ok"
    nofile = run("sys.nofile", facts(_with({"ulimits": {"nofile": {"soft": 1024, "hard": 524288}}}, "low")))
    assert nofile[("low",)] == ("warn", "ulimit -n is 1024: DataLoader workers and many ranks run out of file "
                                "descriptors ('Too many open files')",
                                "raise it in the job's shell: `ulimit -n 524288`")


def test_checkpoint_space_and_speed_against_a_plan() -> None:
    plan = PlanNeeds("plan.yaml", None, checkpoint_bytes(8_000_000_000, "bf16", "adamw"), 16, 2, 8, "h100")
    assert plan.checkpoint_bytes == 112_000_000_000  # 2 (bf16) + 4 (fp32 master) + 8 (Adam m, v) bytes/param
    roomy = DiskFacts("/ckpt", True, "/ckpt", True, 500 << 30, 1 << 40, 256 << 20, 0.5)
    tight = DiskFacts("/ckpt", True, "/ckpt", True, 150 << 30, 1 << 40, 256 << 20, 20.0)
    full = DiskFacts("/ckpt", False, "/", True, 50 << 30, 1 << 40, 256 << 20, 1.0)
    doctor = facts(HostFacts("a", disk=roomy), HostFacts("b", disk=tight), HostFacts("c", disk=full),
                   checkpoint_dir="/ckpt", plan=plan)
    space = run("ckpt.space", doctor)
    assert space[("a",)][:2] == ("ok", "writable, 500 GiB free, at least two of the plan's 104.3 GiB checkpoints")
    assert space[("b",)][0] == "warn"
    assert space[("c",)][:2] == ("fail", "50.0 GiB free in /ckpt (not there yet; measured at /); one checkpoint of "
                                         "the plan is 104.3 GiB")
    speed = run("ckpt.throughput", doctor)
    assert speed[("b",)][:2] == ("warn", "13 MB/s with fsync, all hosts writing at once: the plan's checkpoint takes "
                                         "about 69.5 min")
    assert speed[("a",)][0] == "ok"
    assert run("ckpt.space", facts(HostFacts("a")))[()][:2] == ("skipped", "--checkpoint-dir not given")


def test_checkpoint_space_puts_every_roomy_host_in_one_row() -> None:
    # hosts on one file system probed a moment apart see free space move under other jobs' writes
    def disk(free_gib: float) -> DiskFacts:
        return DiskFacts("/ckpt", True, "/ckpt", True, int(free_gib * (1 << 30)), 1 << 40, 256 << 20, 0.5)

    space = run("ckpt.space", facts(HostFacts("a", disk=disk(12.4)), HostFacts("b", disk=disk(12.6)),
                                    HostFacts("c", disk=disk(12.45)), checkpoint_dir="/ckpt"))
    assert space == {("a", "b", "c"): ("ok", "writable, 12-13 GiB free", "")}
    same = run("ckpt.space", facts(HostFacts("a", disk=disk(12.4)), HostFacts("b", disk=disk(12.1)),
                                   checkpoint_dir="/ckpt"))
    assert same == {("a", "b"): ("ok", "writable, 12 GiB free", "")}


def test_checkpoint_directory_sharing() -> None:
    base = {"checkpoint_dir": "/ckpt"}
    shared = run("ckpt.shared", facts(shared=SharedDir("a", ("b", "c"), ()), **base))
    assert shared[("a", "b", "c")][:2] == ("ok", "shared: a marker written on a is seen by every host")
    local = run("ckpt.shared", facts(shared=SharedDir("a", (), ("b", "c")), **base))
    assert local[("a", "b", "c")][0] == "warn"
    split = run("ckpt.shared", facts(shared=SharedDir("a", ("b",), ("c",)), **base))
    assert split[("c",)][:2] == ("fail", "does not see the marker written on a: the directory is shared by some hosts "
                                         "only, so shards end up split between file systems")
    assert split[("a", "b")][0] == "ok"


def test_orphans_running_runs_and_kills() -> None:
    orphan = RunRecord("20260101-000000-abcdef", 0, "/r/a.json", "orphan", 10, 11, (11, 12))
    running = RunRecord("20260101-000001-123456", 1, "/r/b.json", "running", 20, 21, (21,))
    killed = RunRecord("20260101-000002-fedcba", 0, "/r/c.json", "orphan", 30, 31, (31,), killed=(31,), removed=True)
    reused = RunRecord("20260101-000003-000000", 0, "/r/d.json", "unverified", 40, 41,
                       note="pid 41 is not that run's process")
    stale = RunRecord("20260101-000004-000000", 0, "/r/e.json", "stale", 50, 51)
    doctor = facts(HostFacts("n1", runs=(orphan, running)), HostFacts("n2", runs=(killed, reused)),
                   HostFacts("n3", runs=(stale,)))
    rows = [(r.verdict, r.hosts, r.message) for r in run_checks(doctor, select("proc.orphans"))]
    assert ("fail", ("n1",), "left by an earlier run, still alive: run 20260101-000000-abcdef node 0 (pids 11,12)") \
        in rows
    assert ("warn", ("n1",), "a run is in progress: run 20260101-000001-123456 node 1 (pids 21)") in rows
    assert ("ok", ("n2",), "ended orphans of run 20260101-000002-fedcba node 0 (pids 31)") in rows
    assert ("warn", ("n2",), "records whose pid now belongs to another process: run 20260101-000003-000000 "
                             "(pid 41 is not that run's process)") in rows
    assert ("ok", ("n3",), "no process left by an earlier fstrain run") in rows


def test_interpreter_and_workdir() -> None:
    doctor = facts(host("a", minimal_report("a"), workdir_exists=True),
                   host("b", minimal_report("b"), python="/opt/py/bin/python", probe_python="python3",
                        python_error="not found or not executable", workdir_exists=False),
                   workdir="/srv/train")
    interp = run("sw.interpreter", doctor)
    assert interp[("b",)][:2] == ("fail", "/opt/py/bin/python cannot run: not found or not executable; the other "
                                          "checks ran with python3")
    work = run("sw.workdir", doctor)
    assert work[("b",)] == ("fail", "/srv/train does not exist", "create it and put the code there (`mkdir -p "
                            "/srv/train`), or use a directory on shared storage")
    assert work[("a",)][0] == "ok"


def test_a_different_python_on_one_host() -> None:
    other = minimal_report("b", software={"python": "3.11.2", "python_executable": "/tmp/x/python3",
                                          "torch_error": "ModuleNotFoundError: No module named 'torch'"})
    doctor = facts(host("a", minimal_report("a")), host("b", other), host("c", minimal_report("c")))
    python = run("sw.python", doctor)
    assert python[("b",)] == ("warn", "Python: 3.11.2 (/tmp/x/python3); most hosts have 3.11.7 (/usr/bin/python3)",
                              "run the same interpreter everywhere: put /usr/bin/python3 first on PATH on these hosts, "
                              "or pass --python /usr/bin/python3")
    torch = run("sw.torch", doctor)
    assert torch[("b",)][:2] == ("fail", "torch: not importable; most hosts have 2.13.0+cpu")
    assert torch[("a", "c")][:2] == ("ok", "torch 2.13.0+cpu (most hosts)")
    minor = minimal_report("b", software={"python": "3.10.12", "python_executable": "/usr/bin/python3"})
    assert run("sw.python", facts(host("a", minimal_report("a")), host("b", minor),
                                  host("c", minimal_report("c"))))[("b",)][0] == "fail"
