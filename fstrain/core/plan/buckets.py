"""DeepSpeed's communication bucket sizes: one rule for what `fstrain render` writes and what the
planner's memory model counts, so the prediction is about the job that actually runs.

They are DeepSpeed's own defaults (DeepSpeed 0.19.8, ``deepspeed/runtime/zero/config.py``),
capped at the model's parameter count, not sizes scaled by its hidden size. An earlier rule,
hidden^2 elements (what the Hugging Face integration substitutes for ``"auto"``), made a bucket
smaller than most weight matrices: ZeRO-1/2 closes a bucket whenever the next gradient would not
fit (``stage_1_and_2.py`` line 1422) and reduces a gradient larger than the bucket on its own
(line 1443), so a GPT-2 1.5B micro-batch became 578 reductions instead of four (docs/configs.md,
"Why these ZeRO values").
"""

from __future__ import annotations

# Elements of the gradient dtype per reduction; ZeRO-1/2 also all-gathers updated partitions in
# pieces of ALLGATHER_BUCKET_ELEMENTS where all_gather_into_tensor is missing (config.py lines
# 113 and 132).
REDUCE_BUCKET_ELEMENTS = 500_000_000
ALLGATHER_BUCKET_ELEMENTS = 500_000_000
# ZeRO-3: parameters gathered ahead of use (config.py line 222), and the size below which a
# parameter stays whole on every rank, since gathering norm weights and biases costs more
# latency than their memory is worth (line 228).
STAGE3_PREFETCH_BUCKET_ELEMENTS = 50_000_000
STAGE3_PARAM_PERSISTENCE_THRESHOLD = 100_000


def bucket_sizes(num_params: int) -> dict[str, int]:
    """The bucket keys of ``zero_optimization``, in elements, as ``fstrain render`` writes them for
    a model of ``num_params`` parameters: DeepSpeed's defaults, capped at the model's size.

    DeepSpeed allocates the whole reduce bucket whatever the model (``torch.empty(
    reduce_bucket_size)``: stage_1_and_2.py ``setup_buckets`` line 3266, twice with overlap_comm,
    and stage3.py line 782), so a bucket larger than the model would hold gigabytes that no
    gradient ever fills; capped, a small model is reduced in one bucket all the same."""
    size = max(1, num_params)
    return {
        "reduce_bucket_size": min(REDUCE_BUCKET_ELEMENTS, size),
        "allgather_bucket_size": min(ALLGATHER_BUCKET_ELEMENTS, size),
        "stage3_prefetch_bucket_size": min(STAGE3_PREFETCH_BUCKET_ELEMENTS, size),
        "stage3_param_persistence_threshold": STAGE3_PARAM_PERSISTENCE_THRESHOLD,
    }
