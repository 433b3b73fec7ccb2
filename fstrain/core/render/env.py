"""The environment a training job needs from the topology, each variable with its reason.

Rendered as ``fstrain.env``: ``# reason`` on the line above each ``NAME=value``, sorted by name,
so ``set -a; . ./fstrain.env; set +a`` (or ``fstrain launch``) applies it and a diff shows why a
value changed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from fstrain.errors import ConfigError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Interface and RDMA device names as the kernel prints them (eth0, ens1f0np0, mlx5_0, ib0.8001).
_DEVICE = re.compile(r"^[A-Za-z0-9_.:@-]+$")


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str
    reason: str


def render_env(
    *,
    ifname: str | None = None,
    rdma_devices: Sequence[str] = (),
    nccl_topo_file: str | None = None,
    debug: bool = False,
) -> tuple[EnvVar, ...]:
    """The variables for a job, sorted by name.

    ``ifname`` is the interface that reaches the rendezvous host, ``rdma_devices`` the probed
    HCA names (``mlx5_0``...), ``nccl_topo_file`` the absolute path of the generated XML.
    """
    env = [
        EnvVar(
            "TORCH_NCCL_ASYNC_ERROR_HANDLING",
            "1",
            "a failed or timed-out NCCL collective aborts the process instead of hanging the job "
            "(the current name of the deprecated NCCL_ASYNC_ERROR_HANDLING)",
        ),
        EnvVar(
            "TORCH_NCCL_TRACE_BUFFER_SIZE",
            "2000",
            "NCCL flight recorder: each rank keeps its last 2000 collectives and dumps them when one times "
            "out, so a hang shows which rank is not in which collective (fstrain launch --stall-timeout)",
        ),
    ]
    if ifname is not None:
        _check_device("ifname", ifname)
        reason = f"NCCL bootstrap and socket traffic on {ifname}, the interface that reaches the master"
        env.append(EnvVar("NCCL_SOCKET_IFNAME", ifname, reason))
        reason = f"Gloo (CPU collectives, the c10d store's peers) on {ifname} as well"
        env.append(EnvVar("GLOO_SOCKET_IFNAME", ifname, reason))
    if rdma_devices:
        for device in rdma_devices:
            _check_device("rdma device", device)
        hcas = ",".join(sorted(set(rdma_devices)))
        env.append(
            EnvVar(
                "NCCL_IB_HCA",
                f"={hcas}",
                "use exactly the probed RDMA devices ('=' makes mlx5_1 not also match mlx5_10)",
            )
        )
    if nccl_topo_file is not None:
        if not nccl_topo_file.startswith("/"):
            raise ConfigError(
                f"NCCL_TOPO_FILE must be an absolute path, got {nccl_topo_file!r}",
                "ranks start in other working directories",
                "nccl_topo_file",
            )
        reason = "the node's GPU/NIC topology as fstrain probed it, so NCCL does not guess from sysfs"
        env.append(EnvVar("NCCL_TOPO_FILE", nccl_topo_file, reason))
    if debug:
        env += [
            EnvVar("NCCL_DEBUG", "INFO", "debug run: NCCL prints its rings, trees, transports and chosen NICs"),
            EnvVar("TORCH_DISTRIBUTED_DEBUG", "DETAIL", "debug run: c10d checks that ranks call matching collectives"),
            EnvVar("TORCH_CPP_LOG_LEVEL", "INFO", "debug run: c10d's messages are printed at INFO only"),
        ]
    return tuple(sorted(env, key=lambda var: var.name))


def _check_device(what: str, name: str) -> None:
    if not name or not _DEVICE.match(name):
        raise ConfigError(
            f"{what} {name!r} is not a device name", "use the name `ip link` or `ibv_devices` prints", what
        )


def format_env_file(env: Sequence[EnvVar]) -> str:
    """``# reason`` + ``NAME=value`` pairs; values are plain words, so no quoting is needed."""
    lines = ["# Environment for a training job, rendered by `fstrain render`. Each variable says why.", ""]
    for var in env:
        if not _NAME.match(var.name) or any(ch in var.value for ch in "\n'\"$`\\ "):
            raise ConfigError(f"cannot write {var.name}={var.value!r} to an env file", "", "fstrain.env")
        lines.append(f"# {var.reason}")
        lines.append(f"{var.name}={var.value}")
    return "\n".join(lines) + "\n"
