"""Every number the planner assumes rather than derives, in one place, each overridable.

The memory and time models are exact arithmetic on top of these. The defaults are the values
the references support (../shared/references/planner.md sections 1.3, 1.4 and 4); ``fstrain plan
--assume KEY=VALUE`` replaces any of them, and the plan output lists them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from fstrain.core.plan.fitted import FRAGMENTATION_FRACTION
from fstrain.core.plan.gemmcurve import MeasuredGemmCurve
from fstrain.errors import InputError

_MIB = 1 << 20


def _stated(default: Any, doc: str) -> Any:
    """A dataclass field whose default is an assumption, explained by ``doc``."""
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True)
class Assumptions:
    """Stated assumptions of the memory and time models (all per GPU unless named otherwise)."""

    cuda_context_bytes: int = _stated(
        512 * _MIB,
        "CUDA context and kernel images, outside PyTorch's allocator: 0.3-0.5 GiB with lazy "
        "module loading (CUDA >= 11.7), about 1.3 GiB before (pytorch #86509, HF 'model training "
        "anatomy').",
    )

    nccl_bytes_per_communicator: int = _stated(
        600 * _MIB,
        "NCCL buffers per process group a rank belongs to (544-688 MB measured per group on "
        "4xA100 NVLink, nccl #964; up to 1.6 GB with many channels, nccl #864).",
    )

    fragmentation_fraction: float = _stated(
        FRAGMENTATION_FRACTION,
        "Allocator reserve above the live tensors, as a fraction of the step's transient memory "
        "(all that is live at the peak but parameters and optimizer states, which are allocated once): "
        "the caching allocator keeps freed blocks of activations, gradients and buffers. Fitted on the "
        "calibration runs that report reserved memory (fstrain/core/plan/fit.py). Part of the peak, not "
        "of what must fit: the allocator frees its cache and retries before it fails an allocation.",
    )

    deepspeed_fp32_grad_partition: bool = _stated(
        True,
        "DeepSpeed ZeRO keeps an fp32 copy of each rank's gradient partition, as its estimators "
        "count it: ZeRO-2 2 + 18/N bytes/param (16-bit and fp32 gradients), ZeRO-3 18/N (fp32 "
        "only). False gives the ZeRO paper's 2 + 2 + K with K = 12.",
    )

    megatron_fp32_main_grads: bool = _stated(
        True,
        "--framework megatron with bf16: Megatron's gradient buffer is fp32 (--main-grads-dtype fp32, its "
        "default, sets accumulate_allreduce_grads_in_fp32: megatron/training/arguments.py @d98e8a6 "
        "L1213-1216), 6 + 12/d bytes/param with the distributed optimizer. False for --grad-reduce-in-bf16.",
    )

    reduce_bucket_elements: int = _stated(
        0,
        "DeepSpeed ``reduce_bucket_size`` (elements of the gradient dtype); 0: DeepSpeed's default 5e8, "
        "capped at the model's size, as `fstrain render` writes it (fstrain/core/plan/buckets.py). ZeRO-1/2 "
        "allocate it twice during backward (overlap_comm).",
    )

    zero3_prefetch_bucket_elements: int = _stated(
        0,
        "DeepSpeed ``stage3_prefetch_bucket_size``: parameters gathered ahead of use; 0: DeepSpeed's "
        "default 5e7, capped at the model's size, as rendered.",
    )

    zero3_max_live_parameters: int = _stated(
        1_000_000_000,
        "DeepSpeed ``stage3_max_live_parameters``: cap on gathered parameters (gathered layer + prefetch).",
    )

    fsdp_prefetch_units: int = _stated(
        1,
        "FSDP units gathered ahead of the current one (forward/backward prefetch).",
    )

    fsdp_reduce_bytes_per_element: int = _stated(
        4,
        "Bytes per element of FSDP's gradient reduce-scatter (MixedPrecision reduce_dtype=float32).",
    )

    autocast_weight_cache: bool = _stated(
        True,
        "amp-bf16/amp-fp16: torch.autocast caches the cast of each weight until the outermost "
        "autocast region exits, checkpointed blocks included (torch 2.13: at::autocast::cached_cast in "
        "aten/src/ATen/autocast_mode.cpp caches casts of fp32 leaves that require grad and are not "
        "views; torch.autocast.__exit__ in torch/amp/autocast_mode.py clears the cache at nesting 0; "
        "shown on CPU for plain modules and FSDP2; ATorch's FSDP runs measure within 3 % with it, "
        "33-42 % under without). False for torch.autocast(cache_enabled=False).",
    )

    fused_mlp: bool = _stated(
        False,
        "The GeLU MLP is flash-attention's FusedMLP (flash_attn/models/gpt.py config fused_mlp: fc1, bias "
        "and gelu in one cuBLASLt GEMM, FusedMLPFunc in flash_attn/ops/fused_dense.py @0251105): it saves "
        "the FFN input, and by mlp_checkpoint_lvl the FFN-wide pre-activation and gelu output. GeLU "
        "models only. Set by --framework flash-attn.",
    )

    mlp_checkpoint_lvl: int = _stated(
        0,
        "flash-attention's FusedMLP checkpoint_lvl (fused_dense.py @0251105 L270-275, L337-343): 0 saves "
        "the pre-activation and the gelu output, 1 only the pre-activation (gelu recomputed in backward), "
        "2 neither (fc1 recomputed in backward). Needs fused_mlp.",
    )

    fused_dropout_add_ln: bool = _stated(
        False,
        "Each block's dropout, residual add and norm are flash-attention's one Triton kernel "
        "(layer_norm_fn in flash_attn/ops/triton/layer_norm.py @0251105, LayerNormFn L914-916): it "
        "saves the residual, the per-row statistics and an int64 dropout seed per row instead of 1-byte "
        "dropout masks. Set by --framework flash-attn.",
    )

    packed_qkv: bool = _stated(
        False,
        "q, k and v are one linear layer (flash-attention's MHA: self.Wqkv = nn.Linear(embed_dim, qkv_dim), "
        "flash_attn/modules/mha.py L459 @0251105): under autocast it saves one cast of its input, not "
        "three. Set by --framework flash-attn.",
    )

    adamw_foreach: bool = _stated(
        True,
        "AdamW's update runs torch's foreach kernels (torch.optim.AdamW's default on CUDA): one fp32 "
        "copy of the local second moment at once. False: a per-parameter loop, one parameter's copy at "
        "a time (Hugging Face's AdamW, the Trainer's optim='adamw_hf' of transformers 4.x).",
    )

    ddp_bucket_bytes: int = _stated(
        25 * _MIB,
        "DDP ``bucket_cap_mb``; two buckets in flight (gradient_as_bucket_view assumed).",
    )

    logits_bytes_per_element: int = _stated(
        0,
        "Bytes per logit at the loss's peak; 0 = what --loss holds, read off its source "
        "(fstrain/core/plan/losses.py: full 12 in backward, fused 2x the compute dtype, megatron 12, chunked:N).",
    )

    sequence_parallel: bool = _stated(
        True,
        "With TP > 1, norms and dropout activations are split too (Megatron/torchtitan default).",
    )

    cpu_buffer_factor: float = _stated(
        1.5,
        "DeepSpeed's ``additional_buffer_factor`` on host memory for offloaded state.",
    )

    sharded_init: bool = _stated(
        True,
        "ZeRO-3 builds the model under ``zero.Init`` and FSDP on the meta device, so host memory "
        "at start-up is one layer per process, not the whole model (DeepSpeed's ``zero_init``).",
    )

    host_memory_bytes: int = _stated(
        1 << 40,
        "RAM per node that CPU offload may use, when the probe does not say (DGX A100: 1-2 TB, "
        "DGX H100: 2 TB, AWS p4d 1.1 TB); 0 skips the check.",
    )

    collective_efficiency: float = _stated(
        0.8,
        "Fraction of link bandwidth NCCL collectives reach (bus bandwidth / link bandwidth).",
    )

    dp_overlap: float = _stated(
        0.8,
        "Fraction of the compute it can overlap with that data-parallel communication hides behind.",
    )

    tp_overlap: float = _stated(
        0.0,
        "Fraction of tensor-parallel all-reduce time hidden (0: Megatron without comm overlap).",
    )

    collective_latency_s: float = _stated(
        14e-6,
        "Latency of one step of a ring collective across nodes (the alpha of alpha-beta): NCCL's "
        "tuning model, hwLat NET Ring Simple = 14 us (NVIDIA/nccl src/graph/tuning.cc @b647562). "
        "A ring all-gather or reduce-scatter over n ranks on k nodes takes k - 1 such steps and "
        "n - k inside nodes; an all-reduce the cheaper of the ring's 2(n - 1) and a tree's "
        "2 (ranks per node - 1 + log2 k) (fstrain/core/plan/nccllatency.py).",
    )

    nvlink_latency_s: float = _stated(
        3.4e-6,
        "Latency of one step of a ring collective inside a node over NVLink: NCCL's hwLat NVLINK "
        "Ring Simple = 3.4 us (tuning.cc @b647562; over PCIe NCCL's 5.7 us).",
    )

    collective_base_latency_s: float = _stated(
        8.4e-6,
        "Fixed latency of one ring collective whatever its size and group: NCCL's baseLat Ring "
        "Simple = 8.4 us (tuning.cc @b647562).",
    )

    layer_overhead_s: float = _stated(
        1e-4,
        "Fixed time per transformer block and micro-batch, forward + backward, whatever its size: "
        "eager PyTorch launches about 30 kernels per block at a few microseconds each, so tiny "
        "micro-batches (seq 1) do not reach the GPU's FLOPs.",
    )

    kernel_launch_s: float = _stated(
        4e-6,
        "Host time of one kernel on the C++ side (dispatcher, allocator, cudaLaunchKernel): what a "
        "backward op in autograd's engine and a compiled kernel cost the CPU. A micro-batch costs at "
        "least the host's time issuing its kernels (fstrain/core/plan/hostlaunch.py).",
    )

    python_op_s: float = _stated(
        8e-6,
        "Host time a torch call from Python adds on top of kernel_launch_s (argument parsing, the "
        "Python binding; PyTorch's operator benchmark: 2.3-3.4 us for the bare path of a tiny op, "
        "pytorch#32194): what each op of an optimizer's Python loop and of FSDP's hooks costs "
        "(fstrain/core/plan/hostlaunch.py).",
    )

    eager_forward_op_s: float = _stated(
        40e-6,
        "Host time per kernel of an eager model's forward: the model's Python, the view and metadata "
        "ops between kernels, the dispatcher, autograd recording and the launch. Eager Llama-2-7B at "
        "batch 1 decodes 25.5 tokens/s on an A100, CPU-overhead bound (pytorch.org/blog/accelerating-"
        "generative-ai-2): 39 ms over 32 blocks of about 30 kernels (fstrain/core/plan/hostlaunch.py).",
    )

    cuda_graphs: bool = _stated(
        False,
        "With --compile, the compiled blocks replay as CUDA graphs (torch.compile mode='reduce-overhead'): "
        "one launch a block and pass instead of one a kernel.",
    )

    compute_time_scale: float = _stated(
        0.0,
        "Measured step compute / the kernel model's priced GPU work: what a framework and the GPU's "
        "sustained clocks add beyond the priced kernels. 0 takes the value fitted on the calibration "
        "runs for the GPU's generation (fstrain/core/plan/fitted.py, fit.py; docs/validation/planner.md).",
    )

    hbm_efficiency: float = _stated(
        0.89,
        "Fraction of the GPU's HBM bandwidth that large memory-bound kernels (elementwise ops, "
        "copies) reach: fstrain bench measured a 1 GiB device-to-device copy at 4,265 GB/s on an "
        "H200 (datasheet 4.8 TB/s; tests/fixtures/gpu/h200-2026-11-30/bench-compute.json). Prices "
        "the elementwise traffic that --compile and --fused-rmsnorm remove.",
    )

    cpu_adam_params_per_s_per_node: float = _stated(
        2e9,
        "Parameters per second a node's CPUs update with DeepSpeed's AVX-vectorised CPU Adam "
        "(ZeRO-Offload's optimizer step; fstrain/core/plan/offload.py).",
    )

    torch_cpu_adamw_params_per_s_per_node: float = _stated(
        2e9 / 6,
        "Parameters per second a node's CPUs update with torch.optim.AdamW on CPU tensors (FSDP's CPU "
        "offload runs the user's optimizer on the host): 1/6 of cpu_adam_params_per_s_per_node, "
        "DeepSpeed's 'DeepSpeedCPUAdam is 5X-7X faster than the standard PyTorch implementation' "
        "(deepspeed.ai/tutorials/zero-offload). `fstrain bench --suite compute` measures it; --calibrate sets it.",
    )

    mfu: float = _stated(
        0.0,
        "Achievable MFU; 0 uses the GPU table's value for the GPU type.",
    )

    gemm_peak_fraction: float = _stated(
        0.6,
        "Fraction of the tensor-core peak a large linear layer's matmul reaches, bf16 and fp8 alike "
        "(--fp8 only): torchao's float8 roofline, H100_PCT_ACHIEVABLE_GEMM_TOPS = 0.6 (pytorch/ao "
        "torchao/float8/roofline_utils.py @d370196). The achievable MFU is lower because it also "
        "pays for attention, norms and elementwise kernels, which fp8 does not speed up; never "
        "taken below the achievable MFU.",
    )

    gemm_curve: MeasuredGemmCurve | None = field(default=None, metadata={"doc": (
        "Achieved TFLOP/s of each GEMM by its (m, n, k) and dtype, measured on the plan's GPU kind by "
        "`fstrain bench --suite compute` (with --model: the model's own shapes) and set by `plan --calibrate "
        "BENCH.json` (fstrain/core/plan/gemmcurve.py); None: not measured. Not settable with --assume."
    )})

    fp8_scale_kernel_s: float = _stated(
        2e-6,
        "Time of the second-stage amax reduction kernel of one dynamic fp8 scale, three per "
        "converted linear and pass (input, weight, gradient): torchao's float8 roofline, "
        "TRITON_KERNEL_1_ELEMENT_TIME_SEC = 0.002 ms (roofline_utils.py @d370196).",
    )


def assumption_docs() -> dict[str, str]:
    """Each assumption's explanation, for the CLI listing and docs."""
    return {f.name: f.metadata["doc"] for f in fields(Assumptions)}


_NUMBERS = ("int", "float", "bool")


def with_overrides(base: Assumptions, pairs: list[str], where: str = "--assume") -> Assumptions:
    """Apply ``KEY=VALUE`` overrides, converting VALUE to the field's type."""
    types = {f.name: f.type for f in fields(Assumptions)}
    settable = ", ".join(k for k, t in types.items() if str(t) in _NUMBERS)
    changes: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in types:
            raise InputError(f"expected KEY=VALUE with a known key, got {pair!r}", f"known keys: {settable}", where)
        if str(types[key]) not in _NUMBERS:
            raise InputError(f"{key} is measured, not a number to assume", "set it with --calibrate BENCH.json from "
                             "`fstrain bench --suite compute --out BENCH.json`", where)
        changes[key] = _convert(text.strip(), str(types[key]), f"{where} {key}")
    return replace(base, **changes)


def _convert(text: str, type_name: str, where: str) -> Any:
    try:
        if type_name == "bool":
            if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(text)
            return text.lower() in ("true", "1", "yes")
        value = float(text)
        if value < 0:
            raise ValueError(text)
        return int(value) if type_name == "int" else value
    except ValueError:
        raise InputError(f"cannot read {text!r} as a non-negative {type_name}", "", where) from None
