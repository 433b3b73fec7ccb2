"""Two habits of FSDP2 training code that the parallel layout alone does not say (planner knobs).

``fsdp2_no_sync`` (``fstrain plan --fsdp2-no-sync``): gradient accumulation under FSDP2's
``set_requires_gradient_sync(False)`` on every micro-batch but the last (KempnerInstitute/
KempnerForge@01b461a ``kempnerforge/training/grad.py`` L32-40 ``maybe_no_sync``). FSDP2 then
skips the reduce-scatter: each unit's post-backward keeps its unsharded gradient and, when the
MixedPrecisionPolicy's ``reduce_dtype`` differs from the gradient's dtype, replaces it by a copy
in the reduce dtype, ``unsharded_accumulated_grad`` (torch 2.13
``torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py`` L607-611 ``if not self.reduce_grads:
... fsdp_param.to_accumulated_grad_if_needed()``; ``_fsdp_param.py`` L802-813
``self.unsharded_accumulated_grad = unsharded_grad.to(self.reduce_dtype)``, L815-821 adds each
later micro-batch's gradient into it). Only the last micro-batch's backward reduce-scatters them
(``_fsdp_param_group.py`` L620-626). So from the first micro-batch's backward to the last one's,
every parameter of the rank's TP/PP share is held unsharded in the reduce dtype:
``fsdp_reduce_bytes_per_element`` bytes each (KempnerForge ``kempnerforge/distributed/parallel.py``
@01b461a L67-72: ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=torch.float32)``, over bf16
parameters: 4 bytes per parameter), where FSDP2 without the knob holds only the sharded
gradients. Its time: one reduce-scatter a step instead of one per micro-batch.

``tp_replicated_logits`` (``--tp-replicated-logits``): under tensor parallelism the output
projection is column-parallel (split over the vocabulary) but gathers its logits to every TP
rank, and the loss is an ordinary cross-entropy over all of them, not vocabulary-parallel; the
token embedding stays whole on every TP rank (KempnerForge ``kempnerforge/distributed/
tensor_parallel.py`` @01b461a L122-132 and L157-164: ``ColwiseParallel(input_layouts=Shard(1),
output_layouts=Replicate())`` on the head, no plan for ``token_embedding``). Memory: the loss
holds ``s x b x V`` logits on every TP rank (not ``V / t``), and the embedding's parameters,
gradients and optimizer states are those of all ``V x h`` weights (FSDP2 still shards them over
the data-parallel ranks). Time: one all-gather of the logits over TP per micro-batch, and the
loss's kernels over all ``V`` columns. Its backward is a local slice (Replicate to Shard).

Pure: values in, values out.
"""

from __future__ import annotations

from fstrain.core.plan.assumptions import Assumptions
from fstrain.core.plan.frameworks import profile
from fstrain.core.plan.losses import has_vocab_head
from fstrain.core.plan.precision import mode
from fstrain.core.plan.schema import ModelSpec, PlanKnobs

NO_SYNC_ITEM = "FSDP2 no-sync: unsharded gradients of the whole stage in the reduce dtype (grad accumulation)"


def no_sync_problem(strategy: str, pp: int, framework: str) -> tuple[str, str] | None:
    """Why ``fsdp2_no_sync`` cannot be planned with these knobs, as (what, what to use instead);
    None when it can.
    It is FSDP2's (an fsdp-* strategy, not a framework that wraps the model in FSDP1, whose own
    no_sync is the framework's), and pipeline parallelism reduces once a step already."""
    if not strategy.startswith("fsdp"):
        return (f"FSDP2's gradient sync is skipped, but the strategy is {strategy}",
                "use an fsdp-* strategy")
    if pp > 1:
        return (f"pp is {pp}: torch's pipeline stage reduces FSDP gradients once a step already",
                "use pp 1")
    if profile(framework).fsdp1:
        return (f"framework {framework} wraps the model in FSDP1, whose no_sync the profile counts already",
                "use an FSDP2 framework (fstrain, torchtitan)")
    return None


def replicated_logits_problem(pp: int, loss: str) -> tuple[str, str] | None:
    """Why ``tp_replicated_logits`` cannot be planned, as (what, what to use instead); None when
    it can. The
    modelled code gathers the logits only without pipeline parallelism (KempnerForge leaves the
    head to its PP stages unparallelised), and a model without a vocabulary head has no logits."""
    if pp > 1:
        return (f"pp is {pp}: the modelled code gathers the logits only without pipeline parallelism",
                "use pp 1")
    if not has_vocab_head(loss):
        return ("loss none has no vocabulary logits to gather", "use a loss over the vocabulary")
    return None


def no_sync_gradient_bytes(stage_params: int, knobs: PlanKnobs, assumptions: Assumptions = Assumptions()) -> int:
    """The unsharded gradients FSDP2 holds between micro-batches under ``fsdp2_no_sync``: every
    parameter of the rank (``stage_params``, its TP share) in the reduce dtype, or in the
    gradient's dtype where that is wider (fp32 training). 0 without the knob or with one
    micro-batch."""
    if not knobs.fsdp2_no_sync or knobs.grad_accum_steps == 1 or not knobs.strategy.startswith("fsdp"):
        return 0
    return stage_params * max(assumptions.fsdp_reduce_bytes_per_element, mode(knobs.precision).grad_bytes)


def logits_split(knobs: PlanKnobs) -> int:
    """The ranks one micro-batch's logits are split over: ``tp``, or 1 when they are gathered."""
    return 1 if knobs.tp_replicated_logits else knobs.tp


def replicated_embedding_extra(embedding_params: int, knobs: PlanKnobs) -> int:
    """Parameters a TP rank holds beyond its vocab-parallel share of the token embedding
    (``embedding_params``: all ``V x h`` of it, and a learned position table) under
    ``tp_replicated_logits``: the ``(t - 1) / t`` a vocab-parallel embedding would not hold.
    0 without the knob or with tp 1 (every stage has the embedding: the knob needs pp 1)."""
    if not knobs.tp_replicated_logits or knobs.tp == 1:
        return 0
    return embedding_params - embedding_params // knobs.tp


def logits_gather_bytes(model: ModelSpec, knobs: PlanKnobs) -> int:
    """Bytes of one micro-batch's gathered logits on a TP rank (``s x b x V`` in the compute
    dtype): what the head's all-gather over TP assembles (0 without the knob or with tp 1)."""
    if not knobs.tp_replicated_logits or knobs.tp == 1 or not has_vocab_head(knobs.loss):
        return 0
    return knobs.seq_len * knobs.micro_batch_size * model.vocab_size * mode(knobs.precision).compute_bytes
