"""The training loop both backends share: data, timing, logging, checkpoints, the summary."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from fstrain import __version__
from fstrain.core.formats import stamped
from fstrain.core.monitor.metricline import StepMetrics
from fstrain.train.data import SyntheticData
from fstrain.train.preempt import DEFAULT_SAVE_ESTIMATE_S, StopSignal, die_of_sigterm, should_save
from fstrain.train.runtime import (
    Runtime,
    all_reduce_max,
    all_reduce_mean,
    peak_bytes,
    peak_memory,
    reset_peak_memory,
)
from fstrain.train.settings import TrainSettings
from fstrain.train.steplog import StepLog


class Engine(Protocol):
    def train_step(self, micro_batches: list[torch.Tensor]) -> tuple[float, float]: ...
    def save(self, directory: Path, step: int) -> None: ...
    def load(self, directory: Path) -> int | None: ...

    compiled_blocks: int  # transformer blocks under torch.compile (the plan's --compile)


def build_engine(settings: TrainSettings, runtime: Runtime) -> Engine:
    if settings.backend == "deepspeed":
        from fstrain.train.deepspeed_backend import DeepSpeedEngine

        return DeepSpeedEngine(settings, runtime)
    from fstrain.train.fsdp_backend import FSDPEngine

    return FSDPEngine(settings, runtime)


def train(settings: TrainSettings, runtime: Runtime) -> dict[str, Any]:
    spec = settings.plan.model
    # Every rank says who it is once, so a launcher's log shows all ranks joined the same world.
    _write_line(f"[fstrain.train] rank {runtime.rank}/{runtime.world_size} local {runtime.local_rank} on "
                f"{socket.gethostname()} ({runtime.device.type}, backend {settings.backend})")
    engine = build_engine(settings, runtime)
    start_step = 0
    if settings.resume and settings.checkpoint_dir is not None:
        start_step = engine.load(settings.checkpoint_dir) or 0
        restart = f"restart {settings.restart}: " if settings.restart else ""
        _log(runtime, f"{restart}resumed from step {start_step}" if start_step else
             f"{restart}no checkpoint yet: starting at step 0")
    data = SyntheticData(spec.vocab_size, spec.seq_len, settings.seed)
    mbs, accum, world = settings.micro_batch_size, settings.grad_accum_steps, runtime.world_size
    tokens_per_step = mbs * accum * world * spec.seq_len
    losses: list[float] = []
    step_seconds: list[float] = []
    reset_peak_memory(runtime.device)
    steplog = StepLog(settings.metrics_dir, settings.tensorboard_dir, runtime.rank)
    saves = _Saves(settings, runtime, engine, last_step=start_step or None)
    with StopSignal() as stop:
        try:
            for step in range(start_step, settings.steps):
                batches = [data.batch(step, m, runtime.rank, world, mbs) for m in range(accum)]
                started = time.perf_counter()
                local_loss, lr = engine.train_step(batches)
                rank_seconds = time.perf_counter() - started  # this rank's own step, before it waits for the others
                loss = all_reduce_mean(local_loss, runtime.device)  # also a barrier: the step is done everywhere
                seconds = time.perf_counter() - started
                losses.append(loss)
                step_seconds.append(seconds)
                if (step + 1) % settings.log_every == 0 or step + 1 == settings.steps:
                    _log_step(settings, runtime, steplog, step + 1, local_loss, loss, lr,
                              tokens_per_step / seconds, rank_seconds)
                saved_step = step + 1
                if saved_step == settings.steps or (settings.checkpoint_interval
                                                    and saved_step % settings.checkpoint_interval == 0):
                    saves.save(saved_step)
                saves.on_signal(stop, saved_step)
        except Exception:
            if stop.received_s is not None:  # a peer is gone with the teardown: end as SIGTERM would
                die_of_sigterm()
            raise
        finally:
            steplog.close()
    memory_max = all_reduce_max(peak_memory(runtime.device), runtime.device)
    # The first step includes one-time work (allocation, DeepSpeed buffers): leave it out of the rate.
    timed = step_seconds[1:] if len(step_seconds) > 1 else step_seconds
    summary: dict[str, Any] = {
        "backend": settings.backend,
        "world_size": world,
        "device": runtime.device.type,
        "model": spec.name,
        "strategy": settings.plan.knobs.strategy,
        "loss": settings.plan.knobs.loss,
        "loss_chunks": settings.loss_chunks,  # what the model's head splits the tokens into
        "compiled_blocks": engine.compiled_blocks,
        "micro_batch_size": mbs,
        "grad_accum_steps": accum,
        "start_step": start_step,
        "steps": settings.steps,
        "losses": losses,
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "tokens_per_step": tokens_per_step,
        "tokens_per_s": (tokens_per_step * len(timed) / sum(timed)) if timed else None,
        "peak_memory_rank0": peak_memory(runtime.device),
        "peak_memory_max_over_ranks": memory_max,
    }
    summary = stamped(summary, "summary", __version__)
    if runtime.is_main and settings.summary_json is not None:
        settings.summary_json.parent.mkdir(parents=True, exist_ok=True)
        tmp = settings.summary_json.with_name(settings.summary_json.name + ".tmp")
        tmp.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, settings.summary_json)
    return summary


def _log_step(settings: TrainSettings, runtime: Runtime, steplog: StepLog, step: int, local_loss: float,
              loss: float, lr: float, tokens_per_s: float, rank_seconds: float) -> None:
    """Every rank's metric line (and metrics.jsonl, TensorBoard), and rank 0's progress line."""
    peaks = peak_memory(runtime.device)
    steplog.step(StepMetrics(step=step, steps=settings.steps, loss=local_loss, lr=lr, tokens_per_s=tokens_per_s,
                             scope="job", step_s=rank_seconds, memory_bytes=peak_bytes(peaks), rank=runtime.rank,
                             time=time.time()),
                 job_loss=loss)
    memory = " ".join(f"{k}={v / 2**20:.1f}MiB" for k, v in peaks.items())
    _log(runtime, f"step {step}/{settings.steps} loss {loss:.4f} lr {lr:.3e} tokens/s {tokens_per_s:,.0f} {memory}")


class _Saves:
    """The checkpoints of a run: at the interval and the end, and on SIGTERM (fstrain/train/preempt.py)."""

    def __init__(self, settings: TrainSettings, runtime: Runtime, engine: Engine, last_step: int | None) -> None:
        self.settings, self.runtime, self.engine = settings, runtime, engine
        self.last_step = last_step  # the newest checkpoint's step (a resumed run's is where it started)
        self.last_seconds = DEFAULT_SAVE_ESTIMATE_S

    def save(self, step: int) -> None:
        directory = self.settings.checkpoint_dir
        if directory is None:
            return
        started = time.monotonic()
        if self.runtime.is_main:
            directory.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        self.engine.save(directory, step)
        self.last_step, self.last_seconds = step, time.monotonic() - started
        _log(self.runtime, f"checkpoint saved: step {step} in {directory}")

    def on_signal(self, stop: StopSignal, step: int) -> None:
        """At a step's end: did any rank get SIGTERM? Then all save (or not) alike, and die of it."""
        seen = torch.tensor([1.0 if stop.received_s is not None else 0.0, stop.since_s(), self.last_seconds],
                            dtype=torch.float64, device=self.runtime.device)
        dist.all_reduce(seen, op=dist.ReduceOp.MAX)
        signalled, since_s, estimate_s = seen.tolist()
        if not signalled:
            return
        grace = self.settings.grace_s
        if self.settings.checkpoint_dir is None:
            _log(self.runtime, f"SIGTERM after step {step}: no checkpoint directory, nothing saved")
        elif should_save(step, self.last_step, since_s, grace, estimate_s):
            self.save(step)
            _log(self.runtime, f"SIGTERM after step {step}: checkpoint saved {since_s + self.last_seconds:.1f} s "
                               f"into the {grace:g} s grace period")
        elif self.last_step is not None and self.last_step >= step:
            _log(self.runtime, f"SIGTERM after step {step}: its checkpoint is already saved")
        else:
            _log(self.runtime, f"SIGTERM after step {step}: no time to save ({since_s:.1f} s of the {grace:g} s "
                               f"grace period gone, a save takes {estimate_s:.1f} s); the newest checkpoint is "
                               f"step {self.last_step if self.last_step is not None else 'none'}")
        die_of_sigterm()


def _log(runtime: Runtime, message: str) -> None:
    if runtime.is_main:
        _write_line(f"[fstrain.train] {message}")


def _write_line(text: str) -> None:
    """One write per line: ranks sharing a pipe (the DeepSpeed launcher's) never split each
    other's lines, which print(), writing the text and the newline separately, would."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
