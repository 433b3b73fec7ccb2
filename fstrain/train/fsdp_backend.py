"""FSDP2 (``fully_shard``) from the rendered ``fsdp.yaml``; checkpoints with torch.distributed.checkpoint."""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.distributed.tensor import Shard

from fstrain import __version__
from fstrain.core.formats import check_format, stamped
from fstrain.core.plan.schema import ModelSpec
from fstrain.core.render.options import lr_multiplier
from fstrain.train.model import GPT, compiled_blocks
from fstrain.train.runtime import Runtime
from fstrain.train.settings import TrainSettings, fsdp_precision, fsdp_training_options
from fstrain.train.steps import adamw8bit, lm_loss, read_latest, save_staged, step_tag

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def autocast_context(cfg: Mapping[str, Any], device_type: str) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` around forward and loss when the FSDP file asks for it (amp-bf16/-fp16)."""
    dtype = cfg.get("autocast")
    if not dtype:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=_DTYPES[str(dtype)])


class FSDPEngine:
    def __init__(self, settings: TrainSettings, runtime: Runtime) -> None:
        assert settings.fsdp is not None
        cfg = settings.fsdp
        self.runtime = runtime
        self.options = fsdp_training_options(cfg)
        self.grad_accum_steps = settings.grad_accum_steps
        torch.manual_seed(settings.seed)  # the same initial weights on every rank
        mesh_cfg = cfg["mesh"]
        self.mesh = init_device_mesh(
            runtime.device.type, tuple(int(n) for n in mesh_cfg["shape"]), mesh_dim_names=tuple(mesh_cfg["dim_names"])
        )
        # Pinned memory needs a CUDA driver; on a CPU-only host the policy still runs, unpinned.
        model, self.sharded = build_sharded_model(
            settings.plan.model, cfg, self.mesh, settings.activation_checkpointing, runtime.device.type == "cuda",
            settings.loss_chunks, settings.plan.knobs.fused_rmsnorm, settings.plan.knobs.compile,
        )
        self.model = model
        self.compiled_blocks = compiled_blocks(model)
        self.optimizer = build_optimizer(model, cfg.get("optimizer", {}), self.options.lr)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: lr_multiplier(step, self.options)
        )
        if cfg.get("loss_scaling") == "dynamic":
            # ShardedGradScaler's found-inf flag is a one-element tensor meeting DTensor
            # gradients; torch warns about the implicit replication, which is what we want.
            warnings.filterwarnings(
                "ignore", message="Found a non-scalar tensor with numel=1 and ndim!=0", category=UserWarning
            )
        self.scaler = (
            ShardedGradScaler(device=runtime.device.type) if cfg.get("loss_scaling") == "dynamic" else None
        )
        self.precision = fsdp_precision(cfg)
        self.cfg = cfg

    def train_step(self, micro_batches: Sequence[torch.Tensor]) -> tuple[float, float]:
        lr = float(self.optimizer.param_groups[0]["lr"])
        total = 0.0
        for tokens in micro_batches:
            # Every micro-batch reduce-scatters into the sharded gradients (torchtitan's default):
            # skipping the sync would keep every parameter's full unsharded gradient between
            # micro-batches (the whole model's, not a shard), which is what the planner and the
            # memory trace do not count.
            with autocast_context(self.cfg, self.runtime.device.type):
                loss = lm_loss(self.model(tokens.to(self.runtime.device)), tokens.to(self.runtime.device))
            scaled = loss / self.grad_accum_steps
            (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
            total += float(loss.detach())
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if self.options.gradient_clipping > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.options.gradient_clipping)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return total / len(micro_batches), lr

    def save(self, directory: Path, step: int) -> None:
        """Every rank writes its own shard files (fstrain.train.steps.save_staged)."""
        save_staged(directory, step_tag(step), self.runtime.is_main, lambda staging: self._write(staging, step))

    def _write(self, staging: Path, step: int) -> None:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(staging))
        if self.runtime.is_main:
            state: dict[str, Any] = {"step": step, "scheduler": self.scheduler.state_dict(),
                                     "world_size": self.runtime.world_size}
            if self.scaler is not None:
                state["scaler"] = self.scaler.state_dict()
            document = stamped(state, "trainer_state", __version__)
            (staging / "trainer_state.json").write_text(json.dumps(document, sort_keys=True) + "\n")

    def load(self, directory: Path) -> int | None:
        tag = read_latest(directory)
        if tag is None:
            return None
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(directory / tag))
        set_state_dict(
            self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
        trainer = json.loads((directory / tag / "trainer_state.json").read_text())
        check_format(trainer, "trainer_state", str(directory / tag / "trainer_state.json"))
        written_by = trainer.get("world_size")
        if self.runtime.is_main and isinstance(written_by, int) and written_by != self.runtime.world_size:
            # DCP reads each rank's part of every tensor from the shards another world wrote.
            print(f"[fstrain.train] {tag} was written by {written_by} ranks: resharded for "
                  f"{self.runtime.world_size}", flush=True)
        self.scheduler.load_state_dict(trainer["scheduler"])
        if self.scaler is not None and "scaler" in trainer:
            self.scaler.load_state_dict(trainer["scaler"])
        return int(trainer["step"])


def build_sharded_model(
    spec: ModelSpec, cfg: Mapping[str, Any], mesh: DeviceMesh, ac: str, pin_memory: bool, loss_chunks: int = 1,
    fused_rmsnorm: bool = False,
    compile_blocks: bool = False,
) -> tuple[GPT, FSDPModule]:
    """The model with the FSDP file's layout: each wrapped block its own ``fully_shard`` unit
    (all-gathered alone), then the root (embeddings, final norm, head). ``fully_shard`` moves
    parameters and buffers to the mesh's device (sharded ones back to the host under offload).
    The memory trace (:mod:`fstrain.train.trace`) builds the same model through this function."""
    with model_dtype(cfg):
        model = GPT(spec, ac, loss_chunks=loss_chunks, fused_rmsnorm=fused_rmsnorm, compile_blocks=compile_blocks)
    wrap_classes = set(cfg.get("wrap", {}).get("module_classes", ["TransformerBlock"]))
    for module in list(model.modules()):
        if type(module).__name__ in wrap_classes:
            shard_unit(module, cfg, mesh, pin_memory)
    return model, shard_unit(model, cfg, mesh, pin_memory)


@contextlib.contextmanager
def model_dtype(cfg: Mapping[str, Any]) -> Iterator[None]:
    """Build in the FSDP file's model dtype: pure bf16 builds the model in bf16 as torchtune does
    (its recipes instantiate the model under training.set_default_dtype); AdamW's states then
    follow the parameters' dtype."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(_DTYPES[str(cfg.get("model_dtype", "float32"))])
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def shard_unit(
    module: torch.nn.Module, cfg: Mapping[str, Any], mesh: DeviceMesh, pin_memory: bool = False
) -> FSDPModule:
    """``module`` made one ``fully_shard`` unit with the FSDP file's mixed precision, offload and
    resharding (the bundled model's blocks and root, and a Hugging Face model's decoder layers)."""
    mp = cfg["mixed_precision"]
    mp_policy = MixedPrecisionPolicy(param_dtype=_DTYPES[mp["param_dtype"]], reduce_dtype=_DTYPES[mp["reduce_dtype"]])
    offload = cfg.get("cpu_offload", {})
    offload_policy: OffloadPolicy = (
        CPUOffloadPolicy(pin_memory=bool(offload.get("pin_memory", True)) and pin_memory)
        if offload.get("enabled", False)
        else OffloadPolicy()
    )
    shard_size = mesh.size(mesh.ndim - 1)  # the shard dimension is the last (hybrid: [replicate, shard])

    def placement(param: torch.nn.Parameter) -> Shard | None:
        # Stacked expert weights (experts, out, in): FSDP2 shards dim 0 with padding, so 8 experts
        # over 64 ranks would leave each rank a whole expert (8x its share). torchtitan's
        # _experts_shard_placement_fn shards them on dim 1 when the experts do not divide evenly.
        if param.dim() == 3 and param.shape[0] % shard_size != 0:
            return Shard(1)
        return None  # FSDP2's default, Shard(0)

    return fully_shard(
        module,
        mesh=mesh,
        reshard_after_forward=bool(cfg["reshard_after_forward"]),
        shard_placement_fn=placement,
        mp_policy=mp_policy,
        offload_policy=offload_policy,
    )


def build_optimizer(model: torch.nn.Module, cfg: Mapping[str, Any], lr: float) -> torch.optim.Optimizer:
    """The FSDP file's optimizer; ``foreach`` (None: torch's choice) is the trace's to set."""
    name = cfg.get("name", "adamw")
    foreach = cfg.get("foreach")
    params = list(model.parameters())
    if name == "sgd":
        return torch.optim.SGD(
            params,
            lr=lr,
            momentum=float(cfg.get("momentum", 0.9)),
            weight_decay=float(cfg.get("weight_decay", 0.0)),
            foreach=foreach,
        )
    if name == "adam8bit":
        return adamw8bit(params, lr)
    betas = cfg.get("betas", (0.9, 0.95))
    return torch.optim.AdamW(
        params,
        lr=lr,
        betas=(float(betas[0]), float(betas[1])),
        eps=float(cfg.get("eps", 1e-8)),
        weight_decay=float(cfg.get("weight_decay", 0.0)),
        foreach=foreach,
    )
