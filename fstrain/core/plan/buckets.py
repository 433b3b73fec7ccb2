"""DeepSpeed communication bucket sizes: one rule for what `fstrain render` writes and what the
planner's memory model counts, so the prediction is about the job that actually runs."""

from __future__ import annotations


def bucket_sizes(hidden_size: int) -> dict[str, int]:
    """Communication buckets in elements, scaled by hidden^2 (one weight matrix's worth).

    These are the values transformers' DeepSpeed integration substitutes for ``"auto"``:
    a bucket of about one hidden x hidden matrix keeps reduce/all-gather calls large enough to
    reach bandwidth without holding gigabytes of staging memory on small models.
    """
    square = hidden_size * hidden_size
    return {
        "reduce_bucket_size": square,
        "allgather_bucket_size": square,
        "stage3_prefetch_bucket_size": int(0.9 * square),
        # Parameters smaller than this (norm weights, biases) stay unpartitioned: gathering
        # them costs more latency than the memory they would save.
        "stage3_param_persistence_threshold": 10 * hidden_size,
    }
