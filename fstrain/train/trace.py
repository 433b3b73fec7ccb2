"""A plan's per-GPU memory, traced by PyTorch itself on fake tensors: nothing is allocated.

The bundled trainer's model (:class:`fstrain.train.model.GPT`, the recipe's exact layout, the
plan's activation checkpointing policy through the same code the trainer runs), or for a model
that came from a Hugging Face config.json transformers' own class (:mod:`fstrain.train.hf_model`,
its own loss), is built under
``FakeTensorMode`` on a fake process group of the plan's data-parallel size, sharded with the
rendered FSDP file's layout (:func:`fstrain.train.fsdp_backend.build_sharded_model`), and run,
after one untracked warm-up step, for two optimizer steps of up to two micro-batches each (each
reduce-scatters its gradients, as the trainer does) under
``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker``. The tracker files
every tensor under a kind (sharded/unsharded parameters and gradients, optimizer state,
activations, temporaries, all-gather and reduce-scatter buffers). Three moments are read in the
second step: the root module's forward peak, its backward peak, and the end of the optimizer step.

Large models are traced at three depths and extrapolated. Every block holds the same parameters and
stores the same activations (one period of ``every-k:N`` is N blocks), and each moment sits at the
same place relative to the blocks at any depth, so every category is an affine function of the
number of blocks: two depths fix the line, the third checks it byte for byte. Below some depth that
can fail (at 2 blocks, FSDP's backward prefetch has no next block to gather at the peak), so the
window slides up (3, 4, 5, then 4, 5, 6); if no window is affine, the full depth is traced.
What a trace cannot see: the CUDA context, NCCL buffers, allocator fragmentation, and ``foreach``
optimizer temporaries (the trace steps AdamW one tensor at a time; its ``foreach`` kernels allocate
temporaries the tracker does not free on fake tensors). The CPU attention kernel stores the output
and the log-sum-exp, as the GPU flash kernel does; it cannot drop out, so with FlashAttention the
trace runs attention without dropout, as the GPU kernel stores nothing for it.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, overload

from fstrain.core.plan.acpolicy import every_k
from fstrain.core.plan.losses import loss_chunks
from fstrain.core.plan.planfile import PlanFile
from fstrain.errors import ConfigError

# fstrain's categories, from the tracker's names (FSDPMemTracker's _FSDPRefType values).
CATEGORIES = {
    "parameters": ("Sharded Param",),
    "gradients": ("Sharded Grad",),
    "optimizer_states": ("OptState",),
    "activations": ("Activation", "Temp", "Inputs"),
    "buffers": ("Unsharded Param", "Unsharded Grad", "All Gather", "Reduce Scatter", "Buffer"),
}
# The root module's forward and backward peaks, the end of the optimizer step, and the highest
# point of the whole trace (the second step's: it has the optimizer state), which can fall between
# the module's forward and backward, in the loss.
MOMENTS = ("forward", "backward", "optimizer step", "loss or elsewhere")
FULL_DEPTH_LIMIT = 6  # blocks (in periods of the AC policy) traced whole without extrapolating
# The shallowest depths can sit outside the affine regime (at 2 blocks FSDP's backward prefetch
# has nothing to overlap with at the peak): the window of three depths slides up to 4, 5, 6.
LAST_WINDOW_START = 4


@dataclass(frozen=True)
class TracedMemory:
    """Bytes per GPU by category at the traced peak, with how they were obtained."""

    moment: str  # which of MOMENTS holds the peak
    categories: dict[str, int]
    raw: dict[str, int]  # the tracker's own categories at that moment
    depths: tuple[int, ...]  # block counts traced
    extrapolated: bool
    seconds: float

    @property
    def total(self) -> int:
        return sum(self.categories.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "moment": self.moment,
            "categories": dict(self.categories),
            "total": self.total,
            "raw": dict(self.raw),
            "depths": list(self.depths),
            "extrapolated": self.extrapolated,
            "seconds": round(self.seconds, 2),
        }


def check_traceable(plan: PlanFile, hf: bool = False) -> None:
    """Refuse what the bundled trainer (and so the trace) does not run, before importing torch;
    ``hf``: the trace builds the Hugging Face model, not the bundled one."""
    from fstrain.core.job.plan import (
        check_supported,
        check_trace_eager,
        check_trace_framework,
        check_trace_hf,
        check_trainer_runs,
    )

    if hf:
        check_trace_hf(plan, "--trace")  # what transformers' model runs and the plan counts
    else:
        check_supported(plan.model)
    check_trainer_runs(plan, "--trace")  # the trace runs the bundled trainer's loop, loss and optimizer
    check_trace_eager(plan, "--trace")  # under fake tensors, eagerly: no compiled blocks
    check_trace_framework(plan, "--trace")  # the bundled trainer's memory, not another framework's
    k = plan.knobs
    if k.tp > 1 or k.pp > 1:
        raise ConfigError(
            f"the plan uses tp={k.tp} pp={k.pp}; the trace runs the bundled trainer, which is data-parallel only",
            "pin --tp 1 --pp 1 to trace",
            "--trace",
        )
    if not k.strategy.startswith("fsdp"):
        raise ConfigError(
            f"strategy {k.strategy}: the trace runs FSDP2 (DeepSpeed's partitioning does not run on fake tensors)",
            "pin --strategy fsdp-full, fsdp-grad-op, fsdp-hybrid or zero3 (traced as fsdp-full) to trace",
            "--trace",
        )


def traced_model(plan: PlanFile, hf_config: str = "") -> str:
    """What the trace builds for ``plan``: the Hugging Face class (with its attention
    implementation and transformers' version), or the bundled trainer's model."""
    if not hf_config:
        return "fstrain.train.model.GPT (the bundled trainer's model)"
    import transformers

    from fstrain.train.hf_model import attention_implementation, model_class

    attention = attention_implementation(plan.knobs.flash_attention)
    return f"transformers {transformers.__version__} {model_class(hf_config)} (attn_implementation={attention!r})"


class LazyChunks(Sequence[Any]):
    """``torch.chunk(tensor, num_chunks, dim)`` padded with empty tensors to ``num_chunks``, as
    FSDP2's ``_chunk_with_empty`` returns it, but each chunk made only when asked for. FSDP2
    asks a parameter for its own rank's chunk and chunk 0 (the padded size); under fake tensors
    making all ``dp`` of them cost more than the rest of building the model (a 405B plan at dp
    512: 14 of 42 s, 141,000 fake tensors), and it grew with the world size."""

    def __init__(self, tensor: Any, num_chunks: int, dim: int) -> None:
        self.tensor, self.num_chunks, self.dim = tensor, num_chunks, dim
        size = int(tensor.size(dim))
        self.size = size
        self.step = -(-size // num_chunks)  # torch.chunk's chunk size: the ceiling

    def __len__(self) -> int:
        return self.num_chunks

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.num_chunks))]
        if index < 0:
            index += self.num_chunks
        if not 0 <= index < self.num_chunks:
            raise IndexError(index)
        start = index * self.step
        if start < self.size:
            return self.tensor.narrow(self.dim, start, min(self.step, self.size - start))
        return self[0].new_empty(0)


@contextlib.contextmanager
def _chunks_on_demand() -> Iterator[None]:
    """FSDP2's parameter chunking, made lazy (:class:`LazyChunks`) while the trace shards its
    model; FSDP2 as it was outside. A torch whose FSDP2 has no ``_chunk_with_empty`` keeps its own."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param

    chunk = getattr(_fsdp_param, "_chunk_with_empty", None)
    if chunk is None:
        yield
        return

    def lazy(tensor: Any, num_chunks: int, dim: int) -> Any:
        if int(tensor.size(dim)) == 0:  # torch.chunk's own rule for an empty dimension
            return chunk(tensor, num_chunks, dim)
        return LazyChunks(tensor, num_chunks, dim)

    _fsdp_param._chunk_with_empty = lazy
    try:
        yield
    finally:
        _fsdp_param._chunk_with_empty = chunk


def trace_plan(plan: PlanFile, fsdp: Mapping[str, Any], full_depth_limit: int = FULL_DEPTH_LIMIT,
               progress: Callable[[str], None] | None = None, hf_config: str = "") -> TracedMemory:
    """Trace ``plan`` (checked by :func:`check_traceable`) with its rendered FSDP file ``fsdp``;
    models deeper than ``full_depth_limit`` periods of the AC policy are extrapolated.
    ``progress`` hears each depth as its trace begins. ``hf_config`` (a config.json's text):
    trace the Hugging Face model it describes (:mod:`fstrain.train.hf_model`), not the bundled one;
    a period is then also the layers after which its layer types repeat."""
    check_traceable(plan, hf=bool(hf_config))
    started = time.monotonic()
    period = max(1, every_k(plan.knobs.activation_checkpointing))
    if hf_config:
        from fstrain.train.hf_model import check_attention, layer_period, require_transformers

        require_transformers()
        check_attention(hf_config, plan.knobs.flash_attention)
        period = math.lcm(period, layer_period(hf_config))
    layers = plan.model.num_layers
    units, rest = divmod(layers, period)
    tracer = _Tracer(plan, fsdp, hf_config)

    def run(depth: int) -> dict[str, dict[str, int]]:
        if progress is not None:
            progress(f"at {depth} of {layers} blocks")
        return tracer(depth)

    if units <= max(full_depth_limit, 4):
        moments = run(layers)
        return _peak(moments, (layers,), False, time.monotonic() - started)
    traced: dict[int, dict[str, dict[str, int]]] = {}  # by units of the AC period
    for first in range(2, LAST_WINDOW_START + 1):
        window = (first, first + 1, first + 2)
        if window[-1] >= units:
            break
        for u in window:
            if u not in traced:
                traced[u] = run(u * period + rest)
        line = _extrapolated([traced[u] for u in window], first, units)
        if line is not None:
            return _peak(line, _depths(traced, period, rest), True, time.monotonic() - started)
    moments = run(layers)  # never affine: trace the real depth
    return _peak(moments, (*_depths(traced, period, rest), layers), False, time.monotonic() - started)


def _extrapolated(window: list[dict[str, dict[str, int]]], first: int, units: int) -> dict[str, dict[str, int]] | None:
    """Every moment at ``units`` on the line through depths ``first`` and ``first + 1``, if the
    third depth lies on it byte for byte; else None."""
    a, b, c = window
    moments = {}
    for moment in MOMENTS:
        if _line(a[moment], b[moment], first, first + 1, first + 2) != c[moment]:
            return None
        moments[moment] = _line(a[moment], b[moment], first, first + 1, units)
    return moments


def _depths(traced: Mapping[int, object], period: int, rest: int) -> tuple[int, ...]:
    return tuple(u * period + rest for u in sorted(traced))


def _line(a: dict[str, int], b: dict[str, int], xa: int, xb: int, x: int) -> dict[str, int]:
    """Each category's value at ``x`` on the line through (xa, a) and (xb, b)."""
    return {key: a[key] + (b[key] - a[key]) * (x - xa) // (xb - xa) for key in a}


def _peak(
    moments: dict[str, dict[str, int]], depths: tuple[int, ...], extrapolated: bool, seconds: float
) -> TracedMemory:
    moment = max(MOMENTS, key=lambda m: moments[m]["Total"])
    raw = {k: v for k, v in moments[moment].items() if k != "Total"}
    categories = {name: sum(raw.get(kind, 0) for kind in kinds) for name, kinds in CATEGORIES.items()}
    return TracedMemory(moment, categories, raw, depths, extrapolated, seconds)


class _Tracer:
    """One fake process group and mesh for the plan; each call traces one depth."""

    def __init__(self, plan: PlanFile, fsdp: Mapping[str, Any], hf_config: str = "") -> None:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.testing._internal.distributed.fake_pg import FakeStore

        self.plan = plan
        self.fsdp = fsdp
        self.hf_config = hf_config
        shape = tuple(int(n) for n in fsdp["mesh"]["shape"])
        world = 1
        for n in shape:
            world *= n
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
        # Built outside fake mode: fully_shard cannot build a mesh from fake tensors.
        self.mesh = init_device_mesh("cpu", shape, mesh_dim_names=tuple(fsdp["mesh"]["dim_names"]))

    def __call__(self, num_layers: int) -> dict[str, dict[str, int]]:
        import torch
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPModState

        from fstrain.train.fsdp_backend import autocast_context, build_optimizer

        knobs = self.plan.knobs
        micro_batches = min(2, knobs.grad_accum_steps)
        # Offload moves states to the host: on a CPU trace there is no device to keep apart.
        cfg = {**self.fsdp, "cpu_offload": {"enabled": False}}
        moments: dict[str, dict[str, int]] = {}
        with FakeTensorMode(), _chunks_on_demand(), self._batches():
            model, lm_loss = self._model(num_layers, cfg)
            optimizer_cfg = {**cfg.get("optimizer", {}), "foreach": False}
            optimizer = build_optimizer(model, optimizer_cfg, 1e-4)
            spec = self.plan.model
            tokens = torch.randint(0, spec.vocab_size, (knobs.micro_batch_size, knobs.seq_len or spec.seq_len))
            _warm_up(model, optimizer, tokens, cfg, lm_loss, autocast_context)
            tracker = FSDPMemTracker(model, optimizer)
            tracker.track_inputs((tokens,))
            with tracker, _same_named_modules():
                for step in range(2):
                    for _ in range(micro_batches):
                        with autocast_context(cfg, "cpu"):
                            loss = lm_loss(model, tokens) / micro_batches
                        loss.backward()
                        if step == 1:  # the second step has optimizer state from the start
                            stats = tracker.memory_tracking[model]
                            _keep_max(moments, "forward", stats.snapshots[_FSDPModState.PEAK_FW])
                            _keep_max(moments, "backward", stats.snapshots[_FSDPModState.PEAK_BW])
                        # The tracker follows one forward per module between resets.
                        tracker.reset_mod_stats()
                    optimizer.step()
                    if step == 1:
                        moments["optimizer step"] = _device(tracker.get_tracker_snapshot("current"))
                    optimizer.zero_grad(set_to_none=True)
            overall = _device(tracker.get_tracker_snapshot("peak"))
        if all(overall["Total"] > moments[m]["Total"] for m in MOMENTS[:3]):
            moments["loss or elsewhere"] = overall
        else:  # the overall peak is one of the three moments already read
            moments["loss or elsewhere"] = {key: 0 for key in overall}
        return moments

    def _batches(self) -> contextlib.AbstractContextManager[None]:
        """What the traced batch is: for a Hugging Face model, unpacked sequences, as transformers
        finds them in a real run (:func:`fstrain.train.hf_model.unpacked_batches`)."""
        if not self.hf_config:
            return contextlib.nullcontext()
        from fstrain.train.hf_model import unpacked_batches

        return unpacked_batches()

    def _model(self, num_layers: int, cfg: Mapping[str, Any]) -> tuple[Any, Callable[[Any, Any], Any]]:
        """The model at ``num_layers`` blocks, sharded, and its loss on a batch of tokens: the
        bundled trainer's, or the Hugging Face model's own (:mod:`fstrain.train.hf_model`)."""
        knobs = self.plan.knobs
        if self.hf_config:
            from fstrain.train.hf_model import build_sharded_hf_model, hf_loss

            model = build_sharded_hf_model(self.hf_config, num_layers, cfg, self.mesh, knobs.activation_checkpointing,
                                           knobs.flash_attention)
            return model, hf_loss
        from fstrain.train.fsdp_backend import build_sharded_model
        from fstrain.train.steps import lm_loss

        spec = replace(self.plan.model, num_layers=num_layers)
        model, _ = build_sharded_model(
            spec, cfg, self.mesh, knobs.activation_checkpointing, False, loss_chunks(knobs.loss), knobs.fused_rmsnorm,
        )
        if knobs.flash_attention:
            _flash_attention_dropout(model)
        return model, lambda module, tokens: lm_loss(module(tokens), tokens)


@contextlib.contextmanager
def _same_named_modules() -> Iterator[None]:
    """Silence the tracker's one false alarm. transformers wraps the functions a hub kernel may
    replace (``apply_rotary_pos_emb``: ``kernels``' ``_create_func_module``) in modules that
    are not in the model's tree, so the tracker names them all by their class, ``Func``, and
    takes one entered inside another for a broken hierarchy. Sizes are filed by tensor, not by
    module, so the trace is unaffected."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The module hierarchy tracking maybe be messed up")
        yield


def _warm_up(model: Any, optimizer: Any, tokens: Any, cfg: Mapping[str, Any], loss_fn: Any, autocast: Any) -> None:
    """One step before the tracker starts. DTensor's sharding propagation builds a full-size fake
    tensor for every argument of an op it has not yet seen in this process (a cache miss in
    ``propagate_op_sharding_non_cached``: ``gen_fake_args``), and the tracker files those under
    the phase they happen in: the first optimizer step's showed up as optimizer state, 4x its
    size, but only in a process that had not traced those shapes before. After this step every
    op of the traced steps hits the cache, and the optimizer state exists from the start."""
    with autocast(cfg, "cpu"):
        loss = loss_fn(model, tokens)
    loss.backward()
    del loss
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _flash_attention_dropout(model: Any) -> None:
    """Trace attention dropout as the GPU's flash kernel runs it: it regenerates its mask from the
    RNG state in backward and stores nothing. The CPU kernel cannot drop out, so with dropout
    SDPA falls back to the math path, which stores every s x s probability and mask; the trace
    turns attention dropout off instead (the residual dropouts, whose masks are stored, stay)."""
    from fstrain.train.model import Attention

    for module in model.modules():
        if isinstance(module, Attention):
            module.dropout = 0.0


def _keep_max(moments: dict[str, dict[str, int]], moment: str, snapshots: list[Any]) -> None:
    for snapshot in snapshots:
        candidate = _device(snapshot)
        if moment not in moments or candidate["Total"] > moments[moment]["Total"]:
            moments[moment] = candidate


def _device(snapshot: Mapping[Any, Mapping[Any, int]]) -> dict[str, int]:
    """The one device's categories, by the tracker's names (plus 'Total')."""
    merged: dict[str, int] = {}
    for values in snapshot.values():
        for kind, value in values.items():
            name = getattr(kind, "value", kind)
            merged[str(name)] = merged.get(str(name), 0) + int(value)
    return merged

