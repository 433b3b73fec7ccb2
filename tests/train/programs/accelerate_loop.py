"""A training loop on Hugging Face Accelerate in the shape of diffusers' training examples
(examples/text_to_image/train_text_to_image.py and its siblings), on a tiny model, one CPU
process:

    python accelerate_loop.py OUT

Accelerate prints no step line of its own. The loop draws the examples' step bar,
``tqdm(range(0, max_train_steps), initial=global_step, desc="Steps")``, advanced once per
optimizer step and given the step's loss and learning rate with ``set_postfix``, and logs the same
numbers with ``accelerator.log(..., step=global_step)`` to Accelerate's TensorBoard tracker, whose
event files in OUT are the truth the test compares the output with.
"""

from __future__ import annotations

import sys

import torch
from accelerate import Accelerator
from tqdm.auto import tqdm

MAX_TRAIN_STEPS = 8
BATCH = 8
FEATURES = 8


def main(out: str) -> None:
    accelerator = Accelerator(cpu=True, log_with="tensorboard", project_dir=out)
    accelerator.init_trackers("loop")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 4))
    x = torch.randn(MAX_TRAIN_STEPS * BATCH, FEATURES, generator=torch.Generator().manual_seed(1))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True)),
                                         batch_size=BATCH)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    global_step = 0
    progress_bar = tqdm(range(0, MAX_TRAIN_STEPS), initial=global_step, desc="Steps",
                        disable=not accelerator.is_local_main_process)
    for inputs, targets in loader:
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            progress_bar.update(1)
            global_step += 1
        logs = {"step_loss": loss.detach().item(), "lr": scheduler.get_last_lr()[0]}
        progress_bar.set_postfix(**logs)
        accelerator.log(logs, step=global_step)
    accelerator.end_training()


if __name__ == "__main__":
    main(sys.argv[1])
