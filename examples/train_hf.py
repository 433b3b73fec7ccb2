"""A tiny GPT-2 trained from scratch by Hugging Face transformers' ``Trainer``, launched by fstrain.

    fstrain launch --hosts node[1-2] --nproc-per-node 1 --on-failure exclude --max-restarts 1 \\
        -- python examples/train_hf.py --max-steps 200

Nothing is downloaded: the model is built from a ``GPT2Config`` (2 layers, 64 wide, a vocabulary
of 256), and the data are made here, sequences that count up from a random token by a random
stride (mod the vocabulary), so the loss falls within a few dozen steps. It trains with gloo on
CPUs, or NCCL on GPUs where torch sees them. The Trainer is used as it is; this script only
reads what fstrain sets (docs/your-trainer.md):

- ``FSTRAIN_CHECKPOINT_DIR``: the Trainer's ``output_dir``, where it saves its own
  ``checkpoint-N`` folders every ``--save-steps`` (fstrain's recovery reads their steps);
- ``FSTRAIN_RESTART`` above 0 (an attempt after a failure): resume from the newest checkpoint
  there that is whole (its ``trainer_state.json``, which the Trainer writes last, is there).

Each logged step (every step, ``--logging-steps 1``) prints the Trainer's log dict with
``include_num_input_tokens_seen``, whose ``train_tokens_per_second`` fstrain shows as the run's
tokens/s, and rank 0 draws the Trainer's bar, whose step fstrain reads live. The global batch
is kept when the world shrinks (an excluded host): gradient accumulation makes up the ranks lost.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

VOCAB = 256
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")  # transformers' PREFIX_CHECKPOINT_DIR folders


class CountingSequences(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """``count`` sequences of ``length`` tokens: ``(start + i * stride) % VOCAB``, start and
    stride drawn with ``seed``; each sequence is its own label (causal LM)."""

    def __init__(self, count: int, length: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (count, 1), generator=generator)
        stride = torch.randint(1, 8, (count, 1), generator=generator)
        self.ids = (start + stride * torch.arange(length)) % VOCAB

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def whole_checkpoint(folder: Path) -> Path | None:
    """The newest ``checkpoint-N`` in ``folder`` that the Trainer finished saving (a host lost
    while saving leaves one without ``trainer_state.json``); None where there is none."""
    found = [(int(m.group(1)), path) for path in (folder.iterdir() if folder.is_dir() else [])
             if (m := _CHECKPOINT_RE.match(path.name)) and (path / "trainer_state.json").is_file()]
    return max(found)[1] if found else None


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--save-steps", type=int, default=20, help="a checkpoint every this many steps")
    parser.add_argument("--logging-steps", type=int, default=1)
    parser.add_argument("--global-batch", type=int, default=16, help="sequences per optimizer step, all ranks")
    parser.add_argument("--micro-batch", type=int, default=8, help="sequences per rank per forward pass")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--output-dir", default=os.environ.get("FSTRAIN_CHECKPOINT_DIR") or "hf-out",
                        help="checkpoints go here (default: $FSTRAIN_CHECKPOINT_DIR, else ./hf-out)")
    return parser.parse_args(argv)


def main(argv: list[str]) -> None:
    args = parse(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.global_batch % (world * args.micro_batch):
        sys.exit(f"train_hf.py: --global-batch {args.global_batch} is not a multiple of "
                 f"{world} ranks x --micro-batch {args.micro_batch}")
    output_dir = Path(args.output_dir)
    restart = int(os.environ.get("FSTRAIN_RESTART", "0") or 0)
    resume = whole_checkpoint(output_dir) if restart > 0 else None
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=args.seq_len, n_embd=64, n_layer=2,
                                       n_head=2, bos_token_id=0, eos_token_id=0))
    training = TrainingArguments(
        output_dir=str(output_dir), max_steps=args.max_steps, per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=args.global_batch // (world * args.micro_batch), learning_rate=3e-3,
        warmup_steps=min(10, args.max_steps // 10), logging_strategy="steps", logging_steps=args.logging_steps,
        include_num_input_tokens_seen="all", save_strategy="steps", save_steps=args.save_steps,
        report_to="none", use_cpu=not torch.cuda.is_available(), seed=0, dataloader_num_workers=0,
        ddp_backend="nccl" if torch.cuda.is_available() else "gloo")
    trainer = Trainer(model=model, args=training,
                      train_dataset=CountingSequences(args.max_steps * args.global_batch, args.seq_len, seed=1))
    if resume is not None:
        print(f"train_hf.py: restart {restart}: resuming from {resume}", flush=True)
    trainer.train(resume_from_checkpoint=str(resume) if resume is not None else None)


if __name__ == "__main__":
    main(sys.argv[1:])
