"""A torchtitan config function for the tests: the sections of ``Trainer.Config`` that
``torchtitan.args`` sets, built from torchtitan's own section classes.

torchtitan 0.3.0's ``Trainer`` (and every model's ``config_registry``) imports triton at import
time (torchtitan/distributed/minimal_async_ep/kernels.py, reached through
torchtitan/models/common), which a CPU build of torch does not have. So the tests hand
``ConfigManager`` this module (``--module tests.torchtitan_sections --config trainer_sections``,
a fully qualified module path, as ConfigManager allows): the same parser, tyro rules and section
dataclasses (with their own validation) as ``--module llama3``, without the model code.
``test_render_torchtitan.py`` checks that every field here is declared the same way in
``Trainer.Config``'s source.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer
from torchtitan.config import CompileConfig, DebugConfig, ParallelismConfig, TrainingConfig
from torchtitan.distributed.activation_checkpoint import ActivationCheckpointingConfig, SelectiveAC


@dataclass(kw_only=True, slots=True)
class TrainerSections:
    hf_assets_path: str = "."  # ConfigManager._validate_config looks for it
    lr_scheduler: LRSchedulersContainer.Config = field(default_factory=LRSchedulersContainer.Config)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    activation_checkpoint: ActivationCheckpointingConfig = field(default_factory=SelectiveAC.Config)
    compile: CompileConfig = field(default_factory=CompileConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)


def trainer_sections() -> TrainerSections:
    return TrainerSections()
