"""fstrain's Python API: what the command line does, for a notebook, a scheduler or a test.

The command line is a thin client of this package: it parses argv into the typed requests
below, calls these functions and prints what they return. Bad input raises the same
``fstrain.errors.FstrainError`` (message, hint, where) the CLI prints as one line.

    from fstrain import api

    planned = api.plan(api.PlanRequest(model=api.ModelRequest("llama3.1-8b"),
                                       cluster=api.ClusterRequest(num_nodes=2, gpu="h100-sxm")))
    run = api.launch(api.LaunchRequest(job=api.JobRequest(model="tiny", nproc_per_node=2)))
    api.runs()                      # runs started from this machine
    handle = api.open_run(run.run_id)
    handle.state(); handle.status(); handle.logs(tail=5); handle.stop(); handle.wait()
    api.collect(7 * 86400)          # `fstrain gc`: what was removed per run and host
    api.report(run.run_id)          # `fstrain report`: planned vs measured, series, events
    api.doctor(api.DoctorRequest()); api.topo(api.TopoRequest())   # checks and topology of the hosts
    api.exec(api.ExecRequest(("uname", "-r"))); api.bench(api.BenchRunRequest())
    api.render(api.RenderRequest("plan.yaml", out="configs"))

Layers (docs/architecture.md): ``fstrain.core`` is pure, ``fstrain.io`` touches hosts and
processes, ``fstrain.api`` resolves requests and drives runs through both, ``fstrain.cli``
parses and prints.
"""

from __future__ import annotations

from fstrain.api.bench import Benched, BenchOptions, BenchRunRequest, bench
from fstrain.api.doctor import Diagnosed, DoctorRequest, doctor
from fstrain.api.exec import ExecRequest, Executed, exec
from fstrain.api.launch import DryRun, Launched, Prepared, dry_run, launch, prepare
from fstrain.api.plan import ClusterRequest, ModelRequest, PinRequest, Planned, PlanRequest, TrainingRequest, plan
from fstrain.api.render import Rendered, RenderRequest, render
from fstrain.api.report import report
from fstrain.api.requests import HostRequest, JobRequest, LaunchRequest, RunSettings, SlurmRequest, TrackerRequest
from fstrain.api.runs import Access, Collected, Run, Stopped, collect, open_run
from fstrain.api.runs import all_runs as runs
from fstrain.api.slurm import JobEnd, SubmitRequest, Submitted, cancel_job, follow_job, job_end, submit
from fstrain.api.topo import Probed, TopoRequest, topo

__all__ = [
    "Access", "BenchOptions", "BenchRunRequest", "Benched", "ClusterRequest", "Collected", "Diagnosed",
    "DoctorRequest", "DryRun", "ExecRequest", "Executed", "HostRequest", "JobEnd", "JobRequest", "LaunchRequest",
    "Launched", "ModelRequest", "PinRequest", "PlanRequest", "Planned", "Prepared", "Probed", "RenderRequest",
    "Rendered", "Run", "RunSettings", "SlurmRequest", "Stopped", "SubmitRequest", "Submitted", "TopoRequest",
    "TrackerRequest", "TrainingRequest", "bench", "cancel_job", "collect", "doctor", "dry_run", "exec", "follow_job",
    "job_end", "launch", "open_run", "plan", "prepare", "render", "report", "runs", "submit", "topo",
]
