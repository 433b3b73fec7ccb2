"""Renderers: a plan (and topology facts) -> the files a training job reads. Pure values.

Public surface::

    render_deepspeed(plan, options, debug=)  -> Rendered   (ds_config.json)
    render_fsdp(plan, options)               -> Rendered   (fsdp.yaml, read by fstrain.train)
    render_accelerate(plan)                  -> Rendered   (accelerate.yaml)
    render_env(ifname=, rdma_devices=, nccl_topo_file=, debug=) -> tuple[EnvVar, ...]
    render_hf_trainer(plan, options, deepspeed_path=, debug=) -> HfTrainerFiles
                                             (hf_training_args.json, hf_ds_config.json)
    render_lightning(plan, options, debug=)  -> Rendered   (lightning.yaml)
    render_torchtitan(plan, options)         -> Rendered   (torchtitan.args, format_torchtitan_args)
    render_bundle(plan, out_dir=, trainers=, ...) -> RenderBundle (all of the above + README)
"""

from __future__ import annotations

from fstrain.core.render.bundle import RenderBundle, render_bundle
from fstrain.core.render.common import Rendered
from fstrain.core.render.deepspeed import render_deepspeed
from fstrain.core.render.env import EnvVar, format_env_file, render_env
from fstrain.core.render.fsdp import render_accelerate, render_fsdp
from fstrain.core.render.hftrainer import HfTrainerFiles, render_hf_trainer
from fstrain.core.render.lightning import render_lightning
from fstrain.core.render.options import TrainingOptions, lr_multiplier
from fstrain.core.render.torchtitan import format_torchtitan_args, render_torchtitan
from fstrain.core.render.trainers import TRAINERS

__all__ = [
    "TRAINERS",
    "EnvVar",
    "HfTrainerFiles",
    "RenderBundle",
    "Rendered",
    "TrainingOptions",
    "format_env_file",
    "format_torchtitan_args",
    "lr_multiplier",
    "render_accelerate",
    "render_bundle",
    "render_deepspeed",
    "render_env",
    "render_fsdp",
    "render_hf_trainer",
    "render_lightning",
    "render_torchtitan",
]
