"""fstrain's reference trainer (imports torch): ``python -m fstrain.train``.

A small GPT built from a recipe or plan (:mod:`fstrain.train.model`) trained on synthetic data
from a fixed seed (:mod:`fstrain.train.data`), with either the rendered FSDP2 file
(:mod:`fstrain.train.fsdp_backend`) or the rendered DeepSpeed config
(:mod:`fstrain.train.deepspeed_backend`). The same code runs on CPU with gloo and on GPUs with
NCCL. Rank 0 logs loss, tokens/s and peak memory every step and writes a JSON summary; every
rank prints its metric line (:mod:`fstrain.train.metrics`) and appends it to its metrics.jsonl,
and rank 0 writes TensorBoard event files when asked (:mod:`fstrain.train.steplog`).
"""
