"""Synthetic training data: a learnable signal from a fixed seed, identical on every run.

The corpus is a small pool of random token sequences. Each training sample is one pool entry,
so a model learns the pool's statistics within a few steps and then memorises the sequences:
the loss falls from ln(vocab) clearly within 20-50 steps, which is what the tests check.

The data order is a function of the global sample index: sample ``i`` of step ``s`` is pool
entry ``pick(seed, s, i)``, whatever the world. A step's global batch (micro-batch x grad-accum x
data-parallel ranks samples) is numbered micro-step by micro-step, rank by rank within one, so
rank ``r`` at micro-step ``m`` trains on samples ``(m x dp + r) x micro ...`` of it. A resumed run
sees exactly the batches the uninterrupted run would have seen, and a run resumed on another
number of ranks with the same global batch (fstrain/core/plan/replan.py) sees the same sequences
at every step, split differently.
"""

from __future__ import annotations

import torch

POOL_SIZE = 16
_MASK = (1 << 64) - 1


def pick(seed: int, step: int, sample: int, pool_size: int) -> int:
    """The pool entry of global sample ``sample`` at ``step`` (splitmix64 of the three)."""
    z = (seed * 0x9E3779B97F4A7C15 + step * 0xBF58476D1CE4E5B9 + sample * 0x94D049BB133111EB + 1) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return (z ^ (z >> 31)) % pool_size


class SyntheticData:
    def __init__(self, vocab_size: int, seq_len: int, seed: int, pool_size: int = POOL_SIZE) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.pool = torch.randint(0, vocab_size, (pool_size, seq_len), generator=generator)
        self.seed = seed

    def samples(self, micro_step: int, dp_rank: int, dp_size: int, micro_batch_size: int) -> range:
        """The global sample indices this rank trains on at ``micro_step`` of a step."""
        first = (micro_step * dp_size + dp_rank) * micro_batch_size
        return range(first, first + micro_batch_size)

    def batch(self, step: int, micro_step: int, dp_rank: int, dp_size: int, micro_batch_size: int) -> torch.Tensor:
        """The token ids (micro_batch_size, seq_len) this rank trains on at (step, micro_step)."""
        size = self.pool.shape[0]
        picks = [pick(self.seed, step, i, size) for i in self.samples(micro_step, dp_rank, dp_size, micro_batch_size)]
        return self.pool[torch.tensor(picks, dtype=torch.long)]
