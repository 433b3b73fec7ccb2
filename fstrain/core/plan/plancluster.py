"""The cluster as the planner sees it: nodes of GPUs, NVLink domains and the network.

The planner takes a list of :class:`NodeGpus`, one per node, so a cluster can come from the
command line (``--num-nodes/--gpus-per-node/--gpu``, or ``--node`` per kind of node) or from a
probe that fills in the measured memory and NVLink domains. Heterogeneous clusters are planned
honestly: every rank runs the same shard of work, so the node with the least usable memory
bounds what fits and the slowest GPU bounds the step time; the plan names both.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from fstrain.core.plan.gpus import GpuSpec, lookup_gpu
from fstrain.core.plan.schema import ClusterSummary
from fstrain.core.plan.timemodel import Links
from fstrain.errors import InputError

GIB = 1 << 30


@dataclass(frozen=True)
class NodeGpus:
    """One node, described by the user or by a probe; ``None`` takes the GPU table's value."""

    gpu: str  # short name or NVML product name
    num_gpus: int
    memory_bytes: int | None = None  # per GPU, e.g. NVML memory.total from a probe
    nvlink_domain_size: int | None = None  # GPUs per NVLink domain on this node
    host: str = ""
    host_memory_bytes: int | None = None  # RAM, to check CPU offload against
    inter_node_gbps: float | None = None  # this node's scale-out bandwidth (sum of NICs), Gb/s
    peak_tflops: float | None = None  # dense bf16/fp16 peak per GPU (--gpu-tflops), TFLOP/s


@dataclass(frozen=True)
class PlannedNode:
    host: str
    gpu: GpuSpec
    num_gpus: int
    memory_bytes: int
    nvlink_domain_size: int
    host_memory_bytes: int | None
    inter_node_gbps: float
    inter_node_source: str

    def describe(self) -> str:
        name = f"{self.host} " if self.host else ""
        return f"{name}{self.num_gpus}x {self.gpu.label} ({self.memory_bytes / GIB:.1f} GiB)"


@dataclass(frozen=True)
class PlanCluster:
    """Validated nodes; the properties are what bounds a uniform (SPMD) plan.

    The derived properties are cached: the search reads them for every configuration.
    """

    nodes: tuple[PlannedNode, ...]

    @cached_property
    def world_size(self) -> int:
        return sum(node.num_gpus for node in self.nodes)

    @cached_property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @cached_property
    def gpus_per_node(self) -> int:
        return min(node.num_gpus for node in self.nodes)

    @cached_property
    def uniform(self) -> bool:
        first = self.nodes[0]
        return all(
            (n.gpu.name, n.num_gpus, n.memory_bytes, n.nvlink_domain_size)
            == (first.gpu.name, first.num_gpus, first.memory_bytes, first.nvlink_domain_size)
            for n in self.nodes
        )

    @cached_property
    def nvlink_domain_size(self) -> int:
        """The NVLink domain every node has (gcd, so a TP group fits inside a domain on any node)."""
        size = 0
        for node in self.nodes:
            size = math.gcd(size, node.nvlink_domain_size)
        return size

    @cached_property
    def memory_node(self) -> PlannedNode:
        """The node whose GPUs have the least memory: it bounds what fits."""
        return min(self.nodes, key=lambda n: n.memory_bytes)

    @cached_property
    def usable_memory_bytes(self) -> int:
        return self.memory_node.memory_bytes

    def speed_node(self, precision: str, mfu: float = 0.0) -> PlannedNode:
        """The node with the slowest GPUs at ``precision``: it bounds the step time."""
        return min(self.nodes, key=lambda n: n.gpu.peak_flops(precision) * (mfu or n.gpu.achievable_mfu))

    def effective_flops(self, precision: str, mfu: float = 0.0) -> float:
        node = self.speed_node(precision, mfu)
        return node.gpu.peak_flops(precision) * (mfu or node.gpu.achievable_mfu)

    def peak_flops(self, precision: str) -> float:
        return sum(node.gpu.peak_flops(precision) * node.num_gpus for node in self.nodes)

    def links(self) -> Links:
        """Per-GPU bandwidths of the weakest node, one direction (NVLink figures are bidirectional)."""
        return Links(
            nvlink_bytes_per_s=min(n.gpu.nvlink_bandwidth_bytes_per_s for n in self.nodes) / 2,
            pcie_bytes_per_s=min(n.gpu.host_link_bytes_per_s for n in self.nodes) / 2,
            inter_node_bytes_per_s=min(n.inter_node_gbps * 1e9 / 8 / n.num_gpus for n in self.nodes),
            host_link_bytes_per_s=min(n.gpu.host_link_bytes_per_s for n in self.nodes),
            nvlink_domain_size=self.nvlink_domain_size,
            gpus_per_node=self.gpus_per_node,
            num_nodes=self.num_nodes,
            hbm_bytes_per_s=min(n.gpu.hbm_bandwidth_bytes_per_s for n in self.nodes),
            # NVLS needs an NVSwitch: a domain of NVL bridge pairs has none
            nvls_efficiency=min(n.gpu.nvls_efficiency for n in self.nodes) if self.nvlink_domain_size > 2 else 0.0,
        )

    def bounded_by(self, precision: str, mfu: float = 0.0) -> str:
        """Which node bounds the plan, in words (empty for a uniform cluster)."""
        if self.uniform:
            return ""
        memory, speed = self.memory_node, self.speed_node(precision, mfu)
        return f"memory bounded by {memory.describe()}; speed bounded by {speed.describe()}"

    def summary(self) -> ClusterSummary:
        memory = self.memory_node
        return ClusterSummary(
            num_nodes=self.num_nodes,
            gpus_per_node=self.gpus_per_node,
            gpu=memory.gpu.name,
            gpu_memory_bytes=memory.memory_bytes,
            hosts=tuple(node.host for node in self.nodes if node.host),
            nvlink_domain_size=self.nvlink_domain_size,
            inter_node_gbps=min(node.inter_node_gbps for node in self.nodes),
        )

    def scaled(self, factor: int) -> PlanCluster:
        """The same nodes ``factor`` times (for "it would fit on N nodes")."""
        return PlanCluster(tuple(node for _ in range(factor) for node in self.nodes))


def build_cluster(
    nodes: Sequence[NodeGpus], inter_node_gbps: float | None = None, where: str = "cluster"
) -> PlanCluster:
    """Resolve GPU names and defaults; ``inter_node_gbps`` (per node, Gb/s) overrides every node's."""
    if not nodes:
        raise InputError("no nodes to plan for", "give --num-nodes and --gpus-per-node, or --node", where)
    planned = []
    for node in nodes:
        at = f"{where}: {node.host}" if node.host else where
        spec = _gpu_spec(node, at)
        if node.num_gpus < 1:
            raise InputError(f"a node needs at least one GPU, got {node.num_gpus}", "", at)
        domain = node.nvlink_domain_size if node.nvlink_domain_size is not None else spec.nvlink_domain_size
        # An NVLink domain never spans nodes here, and must tile the node's GPUs.
        domain = math.gcd(max(1, min(domain, node.num_gpus)), node.num_gpus)
        memory = node.memory_bytes if node.memory_bytes is not None else spec.memory_bytes
        if memory <= 0:
            raise InputError(f"GPU memory must be positive, got {memory}", "", at)
        if inter_node_gbps is not None:
            gbps, source = inter_node_gbps, "--inter-node-gbps"
        elif node.inter_node_gbps is not None:
            gbps, source = node.inter_node_gbps, "probe"
        else:
            gbps = spec.nic_gbps_per_gpu * node.num_gpus
            source = f"assumed {spec.nic_gbps_per_gpu:g} Gb/s per {spec.label}"
        if gbps <= 0:
            raise InputError(f"inter-node bandwidth must be positive, got {gbps}", "", at)
        planned.append(
            PlannedNode(node.host, spec, node.num_gpus, memory, domain, node.host_memory_bytes, gbps, source)
        )
    return PlanCluster(tuple(planned))


def _gpu_spec(node: NodeGpus, where: str) -> GpuSpec:
    """The table's GPU, with --gpu-tflops replacing its peak; a GPU outside the table when both
    --gpu-memory and --gpu-tflops describe it (PCIe card defaults for what they do not say)."""
    try:
        spec = lookup_gpu(node.gpu, where)
    except InputError as exc:
        if node.memory_bytes is None or node.peak_tflops is None:
            raise InputError(exc.message, exc.hint + "; or describe it with --gpu-memory GIB and --gpu-tflops TF",
                             exc.where) from None
        spec = GpuSpec(
            name=node.gpu, label=node.gpu, memory_bytes=node.memory_bytes, bf16_flops=0.0, fp16_flops=0.0,
            fp8_flops=0.0, fp32_flops=0.0, hbm_bandwidth_bytes_per_s=1e12, nvlink_bandwidth_bytes_per_s=0.0,
            nvlink_domain_size=1, host_link_bytes_per_s=64e9, nic_gbps_per_gpu=25.0, achievable_mfu=0.40,
        )
    if node.peak_tflops is None:
        return spec
    if node.peak_tflops <= 0:
        raise InputError(f"--gpu-tflops must be positive, got {node.peak_tflops:g}", "", where)
    peak = node.peak_tflops * 1e12
    # fp8 keeps the table's ratio to bf16 (2x on Hopper and later); fp32 its ratio (1/16 if unknown).
    fp8 = spec.fp8_flops * peak / spec.bf16_flops if spec.bf16_flops else 0.0
    fp32 = spec.fp32_flops * peak / spec.bf16_flops if spec.bf16_flops else peak / 16
    return dataclasses.replace(spec, bf16_flops=peak, fp16_flops=peak, fp8_flops=fp8, fp32_flops=fp32)


def uniform_cluster(
    num_nodes: int,
    gpus_per_node: int,
    gpu: str,
    inter_node_gbps: float | None = None,
    nvlink_domain_size: int | None = None,
) -> PlanCluster:
    """``num_nodes`` identical nodes (what --num-nodes/--gpus-per-node/--gpu describe)."""
    if num_nodes < 1:
        raise InputError(f"expected a positive number of nodes, got {num_nodes}", "", "--num-nodes")
    node = NodeGpus(gpu, gpus_per_node, nvlink_domain_size=nvlink_domain_size)
    return build_cluster([node] * num_nodes, inter_node_gbps, "--gpu")


def node_gpus_from_report(report: Mapping[str, Any], host: str) -> NodeGpus:
    """What the planner needs of a probed node: GPU type and count, memory, NVLink domain, RAM."""
    from fstrain.core.parsers.probe_report import node_from_report
    from fstrain.core.topo.topology import nvlink_domains
    from fstrain.errors import ConfigError

    gpus = report.get("gpus") or []
    if not gpus:
        reason = report.get("gpu_source_reason") or "no GPU found"
        raise ConfigError(f"no GPU to plan for ({reason})",
                          "probe GPU nodes, or describe the cluster with --gpu/--num-nodes/--gpus-per-node", host)
    names = sorted({str(g.get("name")) for g in gpus})
    if len(names) > 1:
        raise ConfigError(f"{host} mixes GPU types ({', '.join(names)})", "plan such a node by hand with --node", host)
    memories = [int(g["memory_total_bytes"]) for g in gpus if g.get("memory_total_bytes")]
    domains = nvlink_domains(node_from_report(dict(report), where=host))
    return NodeGpus(
        gpu=names[0],
        num_gpus=len(gpus),
        memory_bytes=min(memories) if memories else None,
        nvlink_domain_size=max((len(d.gpu_indices) for d in domains), default=1),
        host=host,
        host_memory_bytes=report.get("memory_total_bytes"),
    )
