"""`fstrain doctor`'s checks: pure functions of the collected facts, one module per family.

::

    facts.py        what the edge collects (HostFacts, Connection, Rendezvous, ...)
    result.py       CheckResult, Finding, grouping of identical hosts, verdicts and exit codes
    catalogue.py    every check with its id, what it looks at, the stages it needs; select, run
    reach.py        ssh.connect, clock.skew
    network.py      net.*: hostname, reachability matrix, virtual interfaces, *_SOCKET_IFNAME, MTU, port
    software.py     sw.*: interpreter, workdir, versions, CUDA vs driver, NCCL age
    gpus.py         gpu.*: count, type, ECC, clocks, persistence, processes, memory, PCIe
    nvlink.py       topo.nvlink, topo.identical
    rdma.py         rdma.*: ports, NCCL_IB_HCA, nvidia_peermem, ulimit -l
    ncclenv.py      env.*: unknown names, deprecated names, values, NCCL_TOPO_FILE, consistency
    ncclcatalogue.py  NCCL's variables and accepted values, as data
    system.py       sys.shm, sys.nofile, ckpt.space, ckpt.throughput, ckpt.shared
    orphans.py      proc.orphans
    plan.py         what a plan needs (GPU memory, checkpoint size)
"""

from __future__ import annotations

from fstrain.core.doctor.catalogue import CHECKS, IDS, Check, run_checks, select, stages
from fstrain.core.doctor.facts import DoctorFacts, HostFacts
from fstrain.core.doctor.result import CheckResult, exit_code, summary

__all__ = ["CHECKS", "IDS", "Check", "CheckResult", "DoctorFacts", "HostFacts", "exit_code", "run_checks", "select",
           "stages", "summary"]
