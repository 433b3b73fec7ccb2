"""Hugging Face transformers' ``Trainer``, unchanged, on a tiny GPT-2 built from a config (nothing
downloaded), random tokens, one CPU process:

    python hf_trainer.py OUT

OUT gets the Trainer's checkpoint at its last step, whose ``trainer_state.json`` holds
``log_history``: what the Trainer logged, each entry with its step (the truth the test compares
the output with). tests/fixtures/trainer-output/run_transformers_trainer.py is the larger run
whose output the unit tests keep.
"""

from __future__ import annotations

import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

VOCAB = 64
SEQ_LEN = 32
MAX_STEPS = 6
LOGGING_STEPS = 2


class RandomTokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """``count`` sequences of random token ids, each its own label (causal LM)."""

    def __init__(self, count: int) -> None:
        self.ids = torch.randint(0, VOCAB, (count, SEQ_LEN), generator=torch.Generator().manual_seed(1))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def main(out: str) -> None:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ_LEN, n_embd=32, n_layer=2, n_head=2))
    args = TrainingArguments(output_dir=out, max_steps=MAX_STEPS, per_device_train_batch_size=4, learning_rate=1e-3,
                             warmup_steps=2, logging_strategy="steps", logging_steps=LOGGING_STEPS,
                             save_strategy="steps", save_steps=MAX_STEPS, report_to="none", use_cpu=True, seed=0)
    Trainer(model=model, args=args, train_dataset=RandomTokens(64)).train()


if __name__ == "__main__":
    main(sys.argv[1])
