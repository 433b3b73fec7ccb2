"""PyTorch Lightning's ``Trainer``, unchanged, with its TQDM progress bar (its default where rich
is not installed; named here, where rich may be), on the tiny regression model of
tests/fixtures/trainer-output/run_lightning.py (which logs ``self.log("train_loss", ...,
prog_bar=True)``), one CPU process instead of that capture's two:

    python lightning_trainer.py OUT

OUT gets the CSVLogger's ``metrics.csv``: every step's ``train_loss`` (``log_every_n_steps=1``),
the truth the test compares the output with.
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning as pl
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.loggers import CSVLogger

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures" / "trainer-output"))
from run_lightning import BATCH, Regression, loader

BATCHES = 4
EPOCHS = 2


def main(out: str) -> None:
    pl.seed_everything(0)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=EPOCHS, log_every_n_steps=1,
                         logger=CSVLogger(out, name="lightning"), enable_checkpointing=False,
                         enable_model_summary=False, callbacks=[TQDMProgressBar()])
    trainer.fit(Regression(), loader(BATCHES * BATCH, seed=1))


if __name__ == "__main__":
    main(sys.argv[1])
