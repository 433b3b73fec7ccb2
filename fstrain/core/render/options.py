"""What a render needs beyond the plan: optimizer and schedule settings, shared by both backends.

The plan chooses the parallel layout; it does not choose a learning rate. These values go into
the DeepSpeed ``optimizer``/``scheduler`` blocks and into the FSDP file's ``optimizer`` and
``scheduler`` sections, so the bundled trainer trains the same way under either backend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fstrain.errors import ConfigError


@dataclass(frozen=True)
class TrainingOptions:
    lr: float = 3e-4
    """Peak learning rate, reached at the end of warm-up."""
    weight_decay: float = 0.1
    """Decoupled weight decay (AdamW); L2 penalty for SGD."""
    betas: tuple[float, float] = (0.9, 0.95)
    """Adam moments: 0.95 for the second one is the usual choice for large-batch LLM training."""
    eps: float = 1e-8
    momentum: float = 0.9
    """SGD momentum (used when the plan's optimizer is sgd)."""
    warmup_steps: int = 100
    """Linear warm-up from 0 to ``lr``; 0 with ``total_steps`` 0 means a constant rate."""
    total_steps: int = 0
    """Optimizer steps of the whole run. 0: unknown, the rate stays at ``lr`` after warm-up;
    otherwise it decays along a cosine to ``lr * min_lr_ratio`` at ``total_steps``."""
    min_lr_ratio: float = 0.1
    gradient_clipping: float = 1.0
    """Clip the global gradient norm to this value; 0 disables clipping."""
    seed: int = 1234

    def validate(self) -> None:
        """Refuse values no optimizer or scheduler accepts, naming the option."""
        if not self.lr > 0:
            raise ConfigError(f"lr must be positive, got {self.lr}", "pass --lr 3e-4", "options.lr")
        for name in ("warmup_steps", "total_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{name} must be a non-negative integer, got {value!r}", "", f"options.{name}")
        if self.total_steps and self.warmup_steps < 1:
            raise ConfigError(
                "a decaying schedule needs warmup_steps >= 1",
                "DeepSpeed's WarmupCosineLR refuses 0 warm-up steps; pass --warmup-steps 1 or more",
                "options.warmup_steps",
            )
        if self.total_steps and self.total_steps < self.warmup_steps:
            raise ConfigError(
                f"total_steps({self.total_steps}) is shorter than warmup_steps({self.warmup_steps})",
                "lower --warmup-steps or raise --train-steps",
                "options.total_steps",
            )
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}", "", "options.min_lr_ratio")
        if self.gradient_clipping < 0:
            raise ConfigError(
                f"gradient_clipping must be >= 0, got {self.gradient_clipping}", "0 disables clipping", "options"
            )
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"betas must be in [0, 1), got {self.betas}", "", "options.betas")

    @property
    def has_schedule(self) -> bool:
        return self.warmup_steps > 0 or self.total_steps > 0


def lr_multiplier(step: int, options: TrainingOptions) -> float:
    """The factor on ``lr`` for optimizer step ``step`` (0-based), for the FSDP trainer.

    Linear warm-up over ``warmup_steps`` (step 0 already gets ``1/warmup_steps`` so no step is
    wasted at rate 0), then constant, or a cosine down to ``min_lr_ratio`` at ``total_steps``.
    """
    if step < options.warmup_steps:
        return (step + 1) / options.warmup_steps
    if not options.total_steps:
        return 1.0
    decay_steps = max(1, options.total_steps - options.warmup_steps)
    progress = min(1.0, (step - options.warmup_steps) / decay_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return options.min_lr_ratio + (1.0 - options.min_lr_ratio) * cosine
