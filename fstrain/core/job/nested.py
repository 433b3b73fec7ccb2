"""A launcher inside the launcher: ``fstrain launch -- torchrun train.py`` would start torchrun
(or DeepSpeed's launcher) once per process of the torchrun fstrain already starts on every
node. Pure: the program's argv in, the launcher it names (if any) out."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

# Executables and ``python -m`` modules that start ranks themselves.
LAUNCHER_EXECUTABLES = {"torchrun": "torchrun", "deepspeed": "deepspeed", "accelerate": "accelerate launch"}
LAUNCHER_MODULES = {
    "torch.distributed.run": "torchrun",
    "torch.distributed.launch": "torchrun",
    "deepspeed": "deepspeed",
    "deepspeed.launcher.runner": "deepspeed",
    "deepspeed.launcher.launch": "deepspeed",
    "accelerate.commands.launch": "accelerate launch",
}


def nested_launcher(program: Sequence[str]) -> str | None:
    """The launcher ``program`` starts (``torchrun``, ``deepspeed``, ``accelerate launch``), or None."""
    if not program:
        return None
    name = program[0].rsplit("/", 1)[-1]
    if name in LAUNCHER_EXECUTABLES and (name != "accelerate" or "launch" in program[1:2]):
        return LAUNCHER_EXECUTABLES[name]
    if name.startswith("python"):
        for flag, value in itertools.pairwise(program[1:]):
            if flag == "-m":
                return LAUNCHER_MODULES.get(value)
            if not flag.startswith("-"):
                return None  # a script: what follows are its own arguments
    return None


def nested_launcher_hint(launcher: str) -> str:
    """What to run instead."""
    backend = " --backend deepspeed" if launcher == "deepspeed" else ""
    return (f"drop {launcher} and its options: fstrain starts {'DeepSpeed' if backend else 'torchrun'}'s launcher "
            f"on every node itself, e.g. fstrain launch --hostfile HOSTS --nproc-per-node N{backend} -- "
            "python train.py ARGS")
