"""Placeholders in ``--help``: ``--hostfile FILE``, ``--hosts HOSTS``, ``--steps N``, never ``<str>``.

Named once here, by flag, for every command, instead of a ``metavar=`` on each option: a new
option gets a placeholder from its type and name (FILE, DIR, N, NUMBER, TEXT) until it is listed.
"""

from __future__ import annotations

import inspect
from typing import Any

METAVARS = {
    # host options (every multi-host command)
    "--hostfile": "FILE", "--hosts": "HOSTS", "--include": "FILTER", "--exclude": "FILTER",
    "--gpus-per-node": "N", "--ssh-config": "FILE", "--fanout": "N", "--python": "PATH",
    # exec, doctor
    "--timeout": "SECONDS", "--plan": "FILE", "--checkpoint-dir": "DIR", "--master-port": "PORT",
    "--workdir": "DIR", "--only": "CHECKS", "--skip": "CHECKS", "--write-test-mib": "MIB",
    # launch
    "--nproc-per-node": "N|auto", "--backend": "torchrun|deepspeed|direct", "--env": "NAME=VALUE", "--env-file": "FILE",
    "--max-restarts": "N", "--on-failure": "stop|restart|exclude", "--min-nodes": "N",
    "--checkpoint-interval": "STEPS", "--run-dir": "DIR", "--grace": "SECONDS", "--heartbeat-timeout": "SECONDS",
    "--model": "NAME", "--recipe": "FILE", "--strategy": "STRATEGY", "--micro-batch": "N",
    "--precision": "bf16|fp16|fp32|bf16-pure|amp-bf16|amp-fp16", "--steps": "N",
    "--tensorboard": "DIR", "--metrics-textfile": "DIR", "--mlflow": "URI", "--mlflow-experiment": "NAME",
    "--wandb": "PROJECT",
    # plan
    "--model-params": "COUNT", "--num-nodes": "N", "--gpu": "GPU", "--node": "GPU:COUNT[xNODES]",
    "--nvlink-domain-size": "N", "--inter-node-gbps": "GBPS", "--global-batch": "N", "--global-batch-tokens": "N",
    "--grad-accum": "N", "--seq-len": "N", "--optimizer": "adamw|sgd|adam8bit|adafactor",
    "--ac": "none|selective-op|every-k:N|full",
    "--zero-stage": "0-3", "--tp": "N", "--pp": "N", "--shard-group-size": "N",
    "--pp-schedule": "1f1b|interleaved|zero-bubble", "--pp-virtual-stages": "V", "--ep": "N", "--cp": "N",
    "--offload": "none|optimizer|optimizer+params",
    "--loss": "full|fused|megatron|megatron-core|megatron-inplace|litgpt|chunked[:N]|none", "--framework": "NAME",
    "--train-tokens": "COUNT",
    "--mfu": "FRACTION",
    "--assume": "KEY=VALUE", "--top": "N", "--render": "DIR", "--gpu-memory": "GIB", "--gpu-tflops": "TFLOPS",
    # render, topo
    "--out": "PATH", "--ifname": "IFACE", "--rdma-device": "DEVICE", "--nccl-topo": "FILE", "--lr": "RATE",
    "--warmup-steps": "N", "--train-steps": "N", "--trainer": "hf-trainer|lightning|torchtitan", "--from": "FILE",
    "--output": "FILE",
    # runs, logs, stop, gc
    "--host": "HOST", "--rank": "N", "--tail": "N", "--since": "DURATION", "--older-than": "DURATION",
    "--wait": "SECONDS", "--interval": "SECONDS", "--state": "STATE",
    # launch --slurm
    "--launcher": "ssh|srun", "--partition": "NAME", "--time": "LIMIT", "--account": "NAME", "--qos": "NAME",
    "--constraint": "FEATURES", "--sbatch-arg": "OPTION", "--container-image": "IMAGE",
    "--container-mounts": "SRC:DST[,...]",
    # bench
    "--suite": "SUITES", "--sizes": "SIZES", "--pairs": "all|ring", "--pair-bytes": "BYTES", "--seconds": "SECONDS",
}
# The same flag meaning something else in one command.
COMMAND_METAVARS = {
    ("bench", "--backend"): "nccl|gloo", ("bench", "--out"): "FILE", ("plan", "--out"): "FILE",
    ("render", "--out"): "DIR", ("report", "--out"): "FILE",
}
ARGUMENTS = {"command": "[--] CMD ARGS...", "program": "[-- PROGRAM ARGS...]", "file": "FILE", "run": "RUN"}


def name_placeholders(app: Any) -> None:
    """Give every option and argument of ``app``'s commands a named placeholder."""
    from typer.models import ArgumentInfo, OptionInfo

    for group in app.registered_groups:  # sub-commands (fstrain topo show ...)
        name_placeholders(group.typer_instance)
    for command in app.registered_commands:
        name = command.name or ""
        for parameter in inspect.signature(command.callback).parameters.values():
            info = parameter.default
            if isinstance(info, OptionInfo) and info.metavar is None:
                if "bool" in str(parameter.annotation):
                    continue  # a flag: no value, no placeholder
                flags = [d for d in info.param_decls or () if d.startswith("--")]
                flag = flags[0] if flags else ""
                # (the overridden flags are defined in their command, not shared with another)
                info.metavar = COMMAND_METAVARS.get((name, flag)) or METAVARS.get(flag, "") or _by_type(parameter)
            elif isinstance(info, ArgumentInfo) and info.metavar is None:
                info.metavar = ARGUMENTS.get(parameter.name) or parameter.name.upper()


def _by_type(parameter: inspect.Parameter) -> str:
    annotation, name = str(parameter.annotation), parameter.name
    if "int" in annotation:
        return "N"
    if "float" in annotation:
        return "NUMBER"
    if name.endswith("dir"):
        return "DIR"
    if "Path" in annotation or name.endswith(("file", "path", "config")):
        return "FILE"
    return "TEXT"
