"""`fstrain plan`'s options -> the planner's request and its search, for `plan` and for
`render` with plan options (`fstrain render -o DIR --model tiny --gpu h100-sxm`), which parses
its extra arguments with plan's own options and calls the same API."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fstrain.api.plan import Planned, PlanRequest
    from fstrain.core.calibrate.calibrate import Calibration
    from fstrain.core.plan.plancluster import NodeGpus


def plan_request(params: Mapping[str, Any]) -> PlanRequest:
    """The request `fstrain plan`'s options (click's parameters, by name) describe."""
    from fstrain.api.plan import ClusterRequest, ModelRequest, PinRequest, PlanRequest, TrainingRequest

    p = params
    return PlanRequest(
        model=ModelRequest(p["model"], p["recipe"], p["model_params"]),
        cluster=ClusterRequest(p["num_nodes"], p["gpus_per_node"], p["gpu"], tuple(p["node"] or ()), p["gpu_memory"],
                               p["gpu_tflops"], p["nvlink_domain_size"], p["inter_node_gbps"]),
        training=TrainingRequest(p["seq_len"], p["global_batch"], p["global_batch_tokens"], p["micro_batch"],
                                 p["grad_accum"], p["precision"], p["optimizer"], p["flash_attention"],
                                 p["train_tokens"], p["loss"], p["compile_blocks"], p["fused_rmsnorm"], p["fp8"],
                                 p["fp8_all_gather"], p["framework"], p["fsdp2_no_sync"],
                                 p["tp_replicated_logits"]),
        pins=PinRequest(p["strategy"], p["zero_stage"], p["tp"], p["pp"], p["shard_group_size"], p["micro_batch"],
                        p["grad_accum"], p["ac"], p["offload"], p["pp_schedule"], p["pp_virtual_stages"], p["ep"],
                        p["cp"]),
        assume=tuple(p["assume"] or ()), mfu=p["mfu"])


def check_plan_file(request: PlanRequest, flag: str) -> None:
    """A plan file (--out, --render, render) needs the model's architecture, not only its size."""
    from fstrain.api.plan import resolve_model
    from fstrain.errors import InputError

    if resolve_model(request.model)[0].spec is None:
        raise InputError("a plan file needs the model architecture", f"use --model or --recipe with {flag}", flag)


def run_plan(request: PlanRequest, params: Mapping[str, Any], quiet: bool) -> tuple[Planned, Calibration | None]:
    """The search for ``request``, on the probed hosts (--hostfile/--hosts), inside a Slurm
    allocation on its nodes, calibrated with --calibrate (said on stderr unless ``quiet``)."""
    from dataclasses import replace

    from fstrain.api.plan import plan

    p = params
    probed = probe_cluster(p)
    if probed is None:  # inside a Slurm allocation, the allocation is the cluster
        from fstrain.api.slurm import plan_allocation
        from fstrain.cli.output import console

        num_nodes, gpus_per_node, probed = plan_allocation(
            p["num_nodes"], p["gpus_per_node"], p["gpu"], p["node"], p["python"], p["fanout"],
            lambda line: console().print(line, style="dim", markup=False))
        request = replace(request, cluster=replace(request.cluster, num_nodes=num_nodes, gpus_per_node=gpus_per_node))
    calibration: list[Calibration] = []
    planned_request = request

    def calibrated(base: Any, cluster: Any, training: Any, plan_model: Any) -> Any:
        from fstrain.cli.plan_calibrate import calibrated as measured

        calibration.append(measured(p["calibrate"] or "", planned_request, base, cluster, training.precision,
                                    plan_model.spec, quiet, training.seq_len))
        return calibration[-1].assumptions, calibration[-1].cluster

    planned = plan(request, probed=probed, calibrate=calibrated if p["calibrate"] else None)
    return planned, calibration[-1] if calibration else None


def probe_cluster(params: Mapping[str, Any]) -> list[NodeGpus] | None:
    """With --hostfile/--hosts: probe every host and describe its GPUs; otherwise None."""
    p = params
    if not p["hostfile"] and not p["hosts"]:
        return None
    from fstrain.api.requests import HostRequest
    from fstrain.api.topo import TopoRequest, topo
    from fstrain.core.plan.plancluster import node_gpus_from_report
    from fstrain.errors import TransportError

    probed = topo(TopoRequest(HostRequest(hostfile=p["hostfile"], hosts=p["hosts"], include=p["include"],
                                          exclude=p["exclude"], ssh_config=p["ssh_config"],
                                          accept_new_hosts=p["accept_new_hosts"], fanout=p["fanout"]),
                              python=p["python"]))
    if probed.failures:
        raise TransportError("could not probe " + "; ".join(failure.error for failure in probed.failures),
                             "fix or --exclude those hosts, or describe the cluster with --gpu", "fstrain plan")
    return [node_gpus_from_report(report, host) for host, report in zip(probed.hosts, probed.reports, strict=True)]
