"""Synthetic training data: a learnable signal from a fixed seed, identical on every run.

The corpus is a small pool of random token sequences. Each training sample is one pool entry,
so a model learns the pool's statistics within a few steps and then memorises the sequences:
the loss falls from ln(vocab) clearly within 20-50 steps, which is what the tests check.
Batches are a pure function of (seed, step, micro-step, data-parallel rank): a resumed run
sees exactly the batches the uninterrupted run would have seen.
"""

from __future__ import annotations

import torch

POOL_SIZE = 16


class SyntheticData:
    def __init__(self, vocab_size: int, seq_len: int, seed: int, pool_size: int = POOL_SIZE) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.pool = torch.randint(0, vocab_size, (pool_size, seq_len), generator=generator)
        self.seed = seed

    def batch(self, step: int, micro_step: int, dp_rank: int, dp_size: int, micro_batch_size: int) -> torch.Tensor:
        """The token ids (micro_batch_size, seq_len) this rank trains on at (step, micro_step)."""
        # One generator per (step, micro_step), drawing the global batch, sliced per rank: the
        # data does not depend on how a previous run was interrupted.
        generator = torch.Generator().manual_seed((self.seed * 1_000_003 + step) * 1_009 + micro_step)
        picks = torch.randint(0, self.pool.shape[0], (dp_size * micro_batch_size,), generator=generator)
        mine = picks[dp_rank * micro_batch_size : (dp_rank + 1) * micro_batch_size]
        return self.pool[mine]
