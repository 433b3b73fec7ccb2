#!/usr/bin/env python3
"""The GPU memory check for render + trainer (issue 5): measured peak memory against the plan's.

Run from the repository root on the lent GPU machine (installs nothing, needs no network, imports
no fstrain module itself: every fstrain step is `python3 -m fstrain ...` with PYTHONPATH=<repo>):

    python3 scripts/gpu_train_check.py OUT_DIR [--steps 8] [--model gpt2-1.5b] [--dry-run]

With the device tool: run(command='PYTHONUNBUFFERED=1 timeout 470 python3 scripts/gpu_train_check.py "$OUT"',
timeout_s=500). `--matrix speed` runs FSDP2 and the rendered ZeRO-2 and ZeRO-3 files on the same
model and batch and fails unless each DeepSpeed run reaches 80 % of FSDP2's tokens/s (any matrix
that holds such a pair reports the same verdict). `--matrix timeterms` first times GEMM-shape
sweeps with `fstrain bench --suite compute --model M --micro-batch B` (the bench documents go into
summary.json's `gemm`), then trains a small and a large model at micro-batch 1 and 8. Without a GPU:
`--dry-run` stops after planning and rendering (exit 0), and `--rehearse-on-cpu` also runs the
trainer on the CPU with gloo (tiny recipe by default) to rehearse every step; its numbers are RSS,
not a memory check (timeterms: the sweeps time only the shapes under 2e9 FLOPs, and only tiny trains).

1. Records the machine: python, nvidia-smi, torch (version, CUDA, the GPU and its memory), deepspeed.
2. For each case (fsdp-full, zero2, zero3, fsdp-grad-op), `fstrain plan` pinned to 1 node x 1 GPU
   (`--gpu h200`), bf16, AdamW, no checkpointing, no offload, micro-batch 4 x grad-accum 2: once with
   `--json` (the predicted peak and its breakdown), then with `--out plan.yaml`. If the model does
   not fit, or its largest predicted peak is over 80 % of the GPU's memory, the next smaller shipped
   recipe is used (gpt2-1.5b, then tiny) and the reason is recorded.
   Why gpt2-1.5b: the largest shipped dense recipe whose four layouts all fit one H200 with room to
   spare (predicted 39.8-47.5 GiB of 140), so a plan that under-predicts by 2x still trains; model
   states (~25-31 GB) and activations (~12 GB at micro-batch 4 x 1024 tokens) are both large enough
   to test their formulas. llama2-7b needs 108 GB of model states alone under fsdp-full on one GPU.
3. `fstrain render` for each plan (lr 3e-4, short warm-up, cosine over --steps).
4. Each case runs `python3 -m torch.distributed.run --standalone --nproc-per-node 1 -m fstrain.train`
   with its rendered fsdp.yaml or ds_config.json and the variables of its fstrain.env, for --steps
   steps; the trainer's summary JSON gives CUDA max allocated / max reserved (peaks from the first
   training step on: model construction is before the reset), and nvidia-smi is polled meanwhile
   for the whole process (CUDA context and start-up included). DeepSpeed cases are skipped, with the
   reason, when deepspeed is not importable; a case is skipped when too little time is left.
5. Compares: max reserved / (predicted peak - CUDA context - NCCL), max allocated / (that - the
   fragmentation margin), nvidia-smi peak above the idle baseline / predicted peak. A ratio above 1
   means the plan under-predicts.

Every subprocess has a timeout and runs in its own process group, killed as a whole on timeout or
when this script gets SIGTERM (`timeout 470`); the script keeps its own budget (--budget-s 420),
and skips the cases it has no time left for. A PYTHONPATH set by the caller (carried wheels, e.g.
deepspeed) is kept, after the repository.
Files in OUT_DIR (4, top level, so the device tool brings all back): summary.json (written after
every stage), summary.md (the comparison table), logs.txt (every command and its whole output,
appended as each ends), artifacts.tar.gz (per case: plan.json, plan.yaml, the rendered directory,
the trainer's summary and log). Exit status: 0 every case that could run passed; 1 a plan, render
or run failed (or the script crashed); 2 not run: no CUDA GPU or no torch (after planning and
rendering, which are recorded).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
GIB = 2**30
FALLBACK_MODELS = ("gpt2-1.5b", "tiny")  # shipped recipes, largest first
HEADROOM_FRACTION = 0.8  # a plan must leave 20 % of the GPU free: the check measures, it must not OOM
CLI_TIMEOUT_S = 60
PROBE_TIMEOUT_S = 120
RUN_TIMEOUT_S = 180  # one training run; gpt2-1.5b is expected to take 30-90 s (start-up, CPU init)
MIN_RUN_S = 60  # do not start a run with less time left than this
RESERVE_S = 15  # kept for writing the files at the end


@dataclass(frozen=True)
class Case:
    strategy: str
    backend: str  # the trainer's --backend
    config_file: str  # the rendered file that backend reads
    model: str | None = None  # a shipped recipe or a recipe made here; None: the model chosen for the run
    ac: str = "none"  # activation checkpointing policy, as `fstrain plan --ac` takes it
    micro_batch: int | None = None  # None: --micro-batch
    grad_accum: int | None = None  # None: --grad-accum
    seq_len: int | None = None  # None: the recipe's

    @property
    def name(self) -> str:
        """The case's folder and table label: unique within a matrix."""
        if self.model is None and self.ac == "none":
            return self.strategy
        parts = [self.model or "", self.strategy, f"ac-{self.ac.replace(':', '')}",
                 f"mb{self.micro_batch}" if self.micro_batch else "", f"s{self.seq_len}" if self.seq_len else ""]
        return "-".join(p for p in parts if p)


CASES = (
    Case("fsdp-full", "fsdp", "fsdp.yaml"),
    Case("zero2", "deepspeed", "ds_config.json"),
    Case("zero3", "deepspeed", "ds_config.json"),
    Case("fsdp-grad-op", "fsdp", "fsdp.yaml"),  # last: the second FSDP layout, run if time is left
)

# A Llama-3.1-8B-shaped model cut to 8 blocks (2.8B parameters: the 8B's embeddings and head, 8 of
# its 32 layers), so one H200 holds it unsharded with every activation-checkpointing policy at 8k
# tokens: per-block activations and the 128k-vocabulary logits are both measured at full width.
SLICED_RECIPE = ("llama3.1-8b", 8)
SLICED = f"{SLICED_RECIPE[0]}-{SLICED_RECIPE[1]}l"

# `--matrix calibration`: measured points for the planner's memory and speed models, most valuable
# first (the budget skips the tail). Each case is planned, rendered and trained on its own.
CALIBRATION_CASES = (
    Case("fsdp-full", "fsdp", "fsdp.yaml", SLICED, "none", 1, 1, 8192),
    Case("fsdp-full", "fsdp", "fsdp.yaml", SLICED, "full", 2, 1, 8192),
    Case("fsdp-full", "fsdp", "fsdp.yaml", SLICED, "selective-op", 1, 1, 8192),
    Case("fsdp-full", "fsdp", "fsdp.yaml", SLICED, "every-k:2", 1, 1, 8192),
    Case("fsdp-full", "fsdp", "fsdp.yaml", "gpt2-1.5b", "none", 4, 2, 1024),
    Case("zero3", "deepspeed", "ds_config.json", SLICED, "full", 2, 1, 8192),
    Case("zero2", "deepspeed", "ds_config.json", "gpt2-1.5b", "none", 4, 2, 1024),
    Case("fsdp-grad-op", "fsdp", "fsdp.yaml", SLICED, "full", 2, 1, 4096),
    Case("fsdp-full", "fsdp", "fsdp.yaml", "gpt2-1.5b", "full", 16, 1, 1024),
)

# `--matrix speed`: the rendered DeepSpeed files against FSDP2 on the same model (the run's:
# gpt2-1.5b on a GPU, tiny in a CPU rehearsal) and the same batch, no checkpointing. The rendered
# ZeRO-2 file once trained gpt2-1.5b at 285 tokens/s where FSDP2 ran 13,890 (docs/configs.md).
SPEED_CASES = (
    Case("fsdp-full", "fsdp", "fsdp.yaml"),
    Case("zero2", "deepspeed", "ds_config.json"),
    Case("zero3", "deepspeed", "ds_config.json"),
)
SPEED_MIN_RATIO = 0.8  # a rendered DeepSpeed file must reach 80 % of FSDP2's tokens/s


@dataclass(frozen=True)
class Sweep:
    """One `fstrain bench --suite compute` run: its GEMM sweep times a model's own shapes at a
    micro-batch and sequence length (model None: the default grid)."""

    model: str | None = None
    micro_batch: int = 1
    seq_len: int | None = None  # None: the recipe's

    @property
    def name(self) -> str:
        if self.model is None:
            return "gemm-default-grid"
        return "-".join(p for p in ("gemm", self.model, f"mb{self.micro_batch}",
                                    f"s{self.seq_len}" if self.seq_len else "") if p)


# `--matrix timeterms`: runs that separate the step-time model's terms (issue 20, item 5). The GEMM
# sweeps give each model's GEMMs their measured rate at micro-batch 1 and 8; the training runs of
# the same models and micro-batches give the measured step around them: a small model (tiny, whose
# step is kernel launches and elementwise work), a large one (gpt2-1.5b, GEMM-bound), each at
# micro-batch 1 and 8 (the per-micro-batch costs against the per-token ones). The sliced Llama at
# 8k tokens is the model of the 2026-11-30 calibration runs (tests/fixtures/gpu/h200-2026-11-30),
# whose tokens/s are measured already. Sweeps first (about 20 s each), then the training runs the
# budget leaves time for.
TIME_SWEEPS = (
    Sweep("gpt2-1.5b", 1, 1024),
    Sweep("gpt2-1.5b", 8, 1024),
    Sweep(SLICED, 1, 8192),
    Sweep("tiny", 1),
    Sweep("tiny", 8),
    Sweep(None),
)
TIME_CASES = (  # tiny first: its runs take seconds, gpt2-1.5b's about 45 s each (2026-11-30)
    Case("fsdp-full", "fsdp", "fsdp.yaml", "tiny", "none", 1, 1),
    Case("fsdp-full", "fsdp", "fsdp.yaml", "tiny", "none", 8, 1),
    Case("fsdp-full", "fsdp", "fsdp.yaml", "gpt2-1.5b", "none", 1, 1, 1024),
    Case("fsdp-full", "fsdp", "fsdp.yaml", "gpt2-1.5b", "none", 8, 1, 1024),
)
SWEEP_TIMEOUT_S = 120  # one fstrain bench run: start-up, the 6 s matmul and copy pass, the sweep
MIN_SWEEP_S = 30
CPU_SWEEP_MAX_FLOPS = "2e9"  # a CPU rehearsal times only the small shapes (the rest are listed as skipped)

TORCH_PROBE = r"""
import json, torch
info = {"version": torch.__version__, "cuda_build": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
if info["cuda_available"]:
    props = torch.cuda.get_device_properties(0)
    info.update(device_count=torch.cuda.device_count(), name=props.name, total_memory_bytes=props.total_memory,
                capability=f"{props.major}.{props.minor}", bf16=torch.cuda.is_bf16_supported())
print("TORCH_PROBE", json.dumps(info))
"""


class Terminated(BaseException):
    """SIGTERM (the device tool's `timeout`): unwind, kill the running child, write the summary."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated(f"signal {signum}")


class Check:
    """The run's state: budget, directories, the summary written after every stage."""

    def __init__(self, out: Path, work: Path, budget_s: float) -> None:
        self.out, self.work = out, work
        self.deadline = time.monotonic() + budget_s
        self.summary: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv}
        self.env = dict(os.environ)
        # The repository first, anything the caller put on PYTHONPATH (carried wheels) after it.
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        self.env["PYTHONUNBUFFERED"] = "1"

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        text = json.dumps(self.summary, indent=2, sort_keys=True, default=str) + "\n"
        tmp = self.out / ".summary.json.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.out / "summary.json")

    def run(self, argv: list[str], log: Path, timeout_s: float, *, stdout: Path | None = None,
            env: dict[str, str] | None = None) -> dict[str, Any]:
        """Run argv in its own process group; output to `log` (stdout to `stdout` if given)."""
        try:
            return run_logged(argv, log, min(timeout_s, max(1.0, self.left_s())), env or self.env, stdout)
        finally:  # an interrupted run's output is kept too
            with (self.out / "logs.txt").open("a", encoding="utf-8", errors="replace") as logs:
                logs.write(f"\n===== {log.relative_to(self.work)} =====\n")
                logs.write(log.read_text(errors="replace") if log.exists() else "(no log)\n")
                if stdout is not None:
                    logs.write(f"[stdout: {stdout.stat().st_size if stdout.exists() else 0} bytes, kept as "
                               f"{stdout.relative_to(self.work)} in artifacts.tar.gz]\n")


def run_logged(argv: list[str], log: Path, timeout_s: float, env: dict[str, str],
               stdout: Path | None) -> dict[str, Any]:
    start = time.monotonic()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as log_file:
        log_file.write(f"$ {shlex.join(argv)}\n".encode())
        log_file.flush()
        out_file = stdout.open("wb") if stdout is not None else log_file
        try:
            # A new session: on timeout the whole group goes (torchrun and its worker), never an orphan on the GPU.
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out_file, stderr=log_file, env=env,
                                    cwd=REPO, start_new_session=True)
        except OSError as exc:
            log_file.write(f"cannot start: {exc}\n".encode())
            return {"exit_code": None, "timed_out": False, "seconds": 0.0, "error": str(exc)}
        finally:
            if stdout is not None:
                out_file.close()
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        except BaseException:
            log_file.write(b"[interrupted: the process group was killed]\n")
            raise
        finally:
            if proc.poll() is None:
                kill_group(proc)
        seconds = round(time.monotonic() - start, 1)
        status = f"timed out after {timeout_s:.0f} s, killed" if timed_out else f"exit {proc.returncode}"
        log_file.write(f"[{status}; {seconds} s]\n".encode())
    return {"exit_code": None if timed_out else proc.returncode, "timed_out": timed_out, "seconds": seconds}


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    for sig, grace_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


class GpuMemoryPoller:
    """nvidia-smi's memory.used for GPU 0, sampled while a run goes: the whole process, context included."""

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self.samples_mib: list[int] = []
        self.baseline_mib = self._sample()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    @staticmethod
    def _sample() -> int | None:
        argv = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
            return int(proc.stdout.strip().splitlines()[0]) if proc.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
            return None

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            value = self._sample()
            if value is not None:
                self.samples_mib.append(value)

    def __enter__(self) -> GpuMemoryPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def result(self) -> dict[str, Any]:
        peak = max(self.samples_mib) if self.samples_mib else None
        base = self.baseline_mib
        return {
            "samples": len(self.samples_mib),
            "baseline_used_bytes": base * 2**20 if base is not None else None,
            "max_used_bytes": peak * 2**20 if peak is not None else None,
            "max_used_above_baseline_bytes": (peak - base) * 2**20 if peak is not None and base is not None else None,
        }


def record_machine(check: Check) -> dict[str, Any]:
    """What the machine has; the torch probe's JSON decides whether there is a GPU to run on."""
    probes = check.work / "probes"
    machine: dict[str, Any] = {"python": sys.version.split()[0], "executable": sys.executable,
                               "cpu_count": os.cpu_count()}
    smi_query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
    smi = check.run(smi_query, probes / "nvidia-smi.log", 30, stdout=probes / "nvidia-smi.txt")
    machine["nvidia_smi"] = (probes / "nvidia-smi.txt").read_text().strip() if smi["exit_code"] == 0 else None
    torch_run = check.run([sys.executable, "-c", TORCH_PROBE], probes / "torch.log", PROBE_TIMEOUT_S,
                          stdout=probes / "torch.json")
    torch_line = marked_line(probes / "torch.json", "TORCH_PROBE ") if torch_run["exit_code"] == 0 else None
    machine["torch"] = json.loads(torch_line) if torch_line else None
    # DeepSpeed logs its accelerator choice on stdout at import: take only the marked line.
    ds_probe = "import deepspeed; print('DEEPSPEED_VERSION', deepspeed.__version__)"
    ds_run = check.run([sys.executable, "-c", ds_probe], probes / "deepspeed.log", PROBE_TIMEOUT_S,
                       stdout=probes / "deepspeed.txt")
    ds_line = marked_line(probes / "deepspeed.txt", "DEEPSPEED_VERSION ") if ds_run["exit_code"] == 0 else None
    machine["deepspeed"] = ds_line
    git = run_logged(["git", "rev-parse", "HEAD"], probes / "git.log", 10, check.env, probes / "git.txt")
    machine["git_commit"] = (probes / "git.txt").read_text().strip() if git["exit_code"] == 0 else None
    return machine


def marked_line(path: Path, marker: str) -> str | None:
    """The rest of the last stdout line that starts with marker (libraries may print before it)."""
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.startswith(marker)]
    return lines[-1][len(marker):].strip() if lines else None


def prediction(plan_json: dict[str, Any]) -> dict[str, Any]:
    """The pinned configuration's predicted memory, split into what each measurement can see."""
    best = plan_json["plans"][0]
    memory = best["memory"]
    details = memory.get("details", {})
    peak = int(memory["peak"])
    outside_allocator = int(details.get("CUDA context", 0)) + int(details.get("NCCL communicators", 0))
    allocator = peak - outside_allocator  # what torch's caching allocator would reserve
    return {
        "fits": bool(best["fits"]),
        "usable_bytes": int(best["usable_bytes"]),
        "peak_bytes": peak,
        "allocator_bytes": allocator,
        "tensor_bytes": allocator - int(details.get("allocator fragmentation", 0)),  # live tensors
        "details_bytes": details,
        "tokens_per_s": best.get("tokens_per_s"),
        "step_time_s": best.get("step_time_s"),
    }


def sliced_recipe(check: Check) -> Path:
    """SLICED's recipe file: the shipped recipe with fewer layers (its stated parameter count dropped)."""
    import yaml

    name, layers = SLICED_RECIPE
    path = check.work / f"{SLICED}.yaml"
    if not path.exists():
        recipe = yaml.safe_load((REPO / "recipes" / f"{name}.yaml").read_text())
        recipe["name"] = SLICED
        recipe["description"] = f"{name} cut to its first {layers} layers (GPU calibration)"
        recipe["model"]["num_layers"] = layers
        recipe["model"].pop("params", None)
        path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def plan_and_render(check: Check, model: str, case: Case, args: argparse.Namespace) -> dict[str, Any]:
    """`fstrain plan` pinned to one GPU, then `fstrain render`; returns the case's record."""
    model = case.model or model
    folder = check.work / model / case.name
    folder.mkdir(parents=True, exist_ok=True)
    fstrain = [sys.executable, "-m", "fstrain"]
    micro_batch, grad_accum = case.micro_batch or args.micro_batch, case.grad_accum or args.grad_accum
    model_flag = ["--recipe", str(sliced_recipe(check))] if model == SLICED else ["--model", model]
    seq_flag = ["--seq-len", str(case.seq_len)] if case.seq_len else []
    plan_argv = [
        *fstrain,
        "plan", *model_flag, *seq_flag, "--num-nodes", "1", "--gpus-per-node", "1", "--gpu", args.gpu,
        "--global-batch", str(micro_batch * grad_accum), "--micro-batch", str(micro_batch),
        "--grad-accum", str(grad_accum), "--precision", "bf16", "--optimizer", "adamw", "--strategy", case.strategy,
        "--tp", "1", "--pp", "1", "--ac", case.ac, "--offload", "none", "--json",
    ]  # fmt: skip
    record: dict[str, Any] = {"case": case.name, "strategy": case.strategy, "backend": case.backend, "model": model,
                              "ac": case.ac, "micro_batch": micro_batch, "grad_accum": grad_accum,
                              "seq_len": case.seq_len}
    # Without --out first: with --out, a plan that does not fit exits 2 and prints no JSON, which
    # would look like bad input; exit 1 (nothing fits) is a reason to fall back to a smaller model.
    plan_run = check.run(plan_argv, folder / "plan.log", CLI_TIMEOUT_S, stdout=folder / "plan.json")
    record["plan"] = plan_run
    if plan_run["exit_code"] not in (0, 1):
        record["status"] = "plan failed"
        return record
    plan_json = json.loads((folder / "plan.json").read_text())
    record["predicted"] = prediction(plan_json)
    record["assumptions"] = plan_json.get("assumptions", {})
    if plan_run["exit_code"] == 1:
        record["status"] = "does not fit"
        return record
    save_argv = [*plan_argv, "--out", str(folder / "plan.yaml")]
    record["plan_out"] = check.run(save_argv, folder / "plan-out.log", CLI_TIMEOUT_S, stdout=folder / "plan-out.json")
    if record["plan_out"]["exit_code"] != 0:
        record["status"] = "plan --out failed"
        return record
    render_argv = [
        *fstrain,
        "render", "--plan", str(folder / "plan.yaml"), "-o", str(folder / "render"), "--lr", "3e-4",
        "--warmup-steps", str(max(1, args.steps // 4)), "--train-steps", str(args.steps), "--json",
    ]  # fmt: skip
    render_run = check.run(render_argv, folder / "render.log", CLI_TIMEOUT_S, stdout=folder / "render.json")
    record["render"] = render_run
    if render_run["exit_code"] != 0:
        record["status"] = "render failed"
        return record
    record["notes"] = render_notes(folder / "render", case, record["assumptions"], record["predicted"])
    record["status"] = "rendered"
    return record


def render_notes(render: Path, case: Case, assumptions: dict[str, Any], predicted: dict[str, Any]) -> list[str]:
    """Where the plan's assumptions and the rendered file the job reads disagree (informational)."""
    notes: list[str] = []
    if case.backend != "deepspeed":
        return notes
    zero = json.loads((render / "ds_config.json").read_text()).get("zero_optimization", {})
    for key, assumed_key in (("reduce_bucket_size", "reduce_bucket_elements"),
                             ("allgather_bucket_size", "allgather_bucket_elements"),
                             ("stage3_prefetch_bucket_size", "zero3_prefetch_bucket_elements")):
        # An assumption of 0 means "as fstrain render writes it", so it cannot disagree.
        assumed = int(assumptions.get(assumed_key) or 0)
        if key in zero and assumed and int(zero[key]) != assumed:
            notes.append(f"{case.strategy}: ds_config.json {key} = {int(zero[key]):,} elements, but the plan assumed "
                         f"{assumed_key} = {assumed:,}")
    if notes:
        buckets = sum(v for k, v in predicted["details_bytes"].items() if "bucket" in k or "prefetch" in k)
        notes.append(f"{case.strategy}: so the prediction's bucket terms ({buckets / GIB:.3f} GiB) are sized for "
                     "the assumed values, not for the rendered file")
    return notes


def choose_model(check: Check, args: argparse.Namespace, gpu_bytes: int | None) -> tuple[str, list[dict[str, Any]]]:
    """Plan and render every case for the first model that fits one GPU with headroom."""
    candidates = [args.model] + [m for m in FALLBACK_MODELS if m != args.model]
    fallbacks: list[str] = []
    check.summary["model_fallbacks"] = fallbacks
    records: list[dict[str, Any]] = []
    for model in candidates:
        records = [plan_and_render(check, model, case, args) for case in args.cases]
        check.summary["cases"] = records
        check.save()
        broken = [r for r in records if r["status"] not in ("rendered", "does not fit")]
        if broken:
            return model, records  # a real failure: stop here, the summary says which step
        limit = HEADROOM_FRACTION * (gpu_bytes or min(r["predicted"]["usable_bytes"] for r in records))
        too_big = [r for r in records if r["status"] == "does not fit" or r["predicted"]["peak_bytes"] > limit]
        if not too_big:
            return model, records
        worst = max(too_big, key=lambda r: r["predicted"]["peak_bytes"])
        verdict = "does not fit" if worst["status"] == "does not fit" else "fits, but leaves too little headroom"
        fallbacks.append(f"{model}: {worst['strategy']} predicted {worst['predicted']['peak_bytes'] / GIB:.1f} GiB "
                         f"({verdict}; the limit is {limit / GIB:.1f} GiB, {HEADROOM_FRACTION:.0%} of the GPU)")
    return candidates[-1], records


def env_file_vars(path: Path) -> dict[str, str]:
    """The KEY=VALUE lines of the rendered fstrain.env (comments skipped)."""
    found: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            found[key.strip()] = value
    return found


def run_sweep(check: Check, sweep: Sweep, args: argparse.Namespace, on_gpu: bool) -> dict[str, Any]:
    """`fstrain bench --suite compute` on this machine (one rank): the sweep's record, with the
    whole bench document (the calibration fixture) when it ran."""
    folder = check.work / "gemm" / sweep.name
    folder.mkdir(parents=True, exist_ok=True)
    model_flag: list[str] = []
    if sweep.model is not None:
        model_flag = ["--recipe", str(sliced_recipe(check))] if sweep.model == SLICED else ["--model", sweep.model]
        model_flag += ["--micro-batch", str(sweep.micro_batch)]
        model_flag += ["--seq-len", str(sweep.seq_len)] if sweep.seq_len else []
    argv = [
        sys.executable, "-m", "fstrain", "bench", "--suite", "compute", "--nproc-per-node", "1",
        "--python", sys.executable, "--workdir", str(REPO), "--run-dir", str(folder / "run"),
        "--out", str(folder / "bench.json"), *model_flag,
        *([] if on_gpu else ["--max-gemm-flops", CPU_SWEEP_MAX_FLOPS]),
    ]  # fmt: skip
    record: dict[str, Any] = {"sweep": sweep.name, "model": sweep.model, "micro_batch": sweep.micro_batch,
                              "seq_len": sweep.seq_len, "argv": argv}
    if args.dry_run:
        record["status"] = "dry run"
        return record
    if check.left_s() - RESERVE_S < MIN_SWEEP_S:
        record["status"], record["skipped"] = "skipped", f"out of time ({check.left_s():.0f} s left)"
        return record
    env = dict(check.env)
    if not on_gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    record["status"] = "running"
    record["bench"] = check.run(argv, folder / "bench.log", min(SWEEP_TIMEOUT_S, check.left_s() - RESERVE_S), env=env)
    # Exit 1 is a measurement too (a straggler rank); 2 and 3 are not.
    if record["bench"]["exit_code"] not in (0, 1) or not (folder / "bench.json").exists():
        record["status"] = "timed out" if record["bench"]["timed_out"] else "failed"
        return record
    document = json.loads((folder / "bench.json").read_text())
    shapes = (document.get("analysis", {}).get("gemm") or {}).get("shapes", [])
    record.update(status="ok", document=document, shapes=len(shapes),
                  skipped_shapes=len((document.get("analysis", {}).get("gemm") or {}).get("skipped", [])),
                  best_tflops=max((s["tflops"] for s in shapes), default=None),
                  device_name=shapes[0]["device_name"] if shapes else None,
                  dtype=shapes[0]["dtype"] if shapes else None)
    return record


def sweep_lines(sweeps: list[dict[str, Any]]) -> list[str]:
    """The GEMM sweeps' section of summary.md (the shapes themselves are in summary.json)."""
    if not sweeps:
        return []
    lines = ["", "GEMM sweeps (`fstrain bench --suite compute --model ...`; every shape in summary.json's "
             "gemm[].document):", "", "| sweep | status | device | dtype | shapes (not timed) | best TFLOP/s | s |",
             "|---|---|---|---|---|---|---|"]
    for r in sweeps:
        best = f"{r['best_tflops']:.4g}" if r.get("best_tflops") else "-"
        seconds = (r.get("bench") or {}).get("seconds", "-")
        status = r["status"] + (f": {r['skipped']}" if r.get("skipped") else "")
        lines.append(f"| {r['sweep']} | {status} | {r.get('device_name') or '-'} | {r.get('dtype') or '-'} "
                     f"| {r.get('shapes', '-')} ({r.get('skipped_shapes', 0)}) | {best} | {seconds} |")
    return lines


def train_case(check: Check, record: dict[str, Any], args: argparse.Namespace, on_gpu: bool) -> None:
    """One trainer run under torchrun on one GPU (or the CPU in a rehearsal), compared with the plan."""
    case = next(c for c in args.cases if c.name == record["case"])
    folder = check.work / record["model"] / case.name
    render = folder / "render"
    env = {**check.env, **env_file_vars(render / "fstrain.env"), "FSTRAIN_DEBUG": "1"}
    env.setdefault("OMP_NUM_THREADS", str(min(16, os.cpu_count() or 1)))  # the model is built on the CPU
    if not on_gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the rehearsal trains on the CPU even where a GPU exists
    config_flag = "--fsdp-config" if case.backend == "fsdp" else "--deepspeed-config"
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
        "-m", "fstrain.train", "--plan", str(render / "plan.yaml"), "--backend", case.backend,
        config_flag, str(render / case.config_file), "--steps", str(args.steps),
        "--summary-json", str(folder / "train-summary.json"), "--log-every", "1",
    ]  # fmt: skip
    record["status"] = "running"  # what the summary says if this script is interrupted now
    with GpuMemoryPoller() as poller:
        record["train"] = check.run(argv, folder / "train.log", min(RUN_TIMEOUT_S, check.left_s() - RESERVE_S), env=env)
    record["nvidia_smi_memory"] = poller.result() if on_gpu else None
    summary_path = folder / "train-summary.json"
    if record["train"]["exit_code"] != 0 or not summary_path.exists():
        log = (folder / "train.log").read_text(errors="replace")
        oom = "CUDA out of memory" in log or "OutOfMemoryError" in log  # a result too: the plan said it fits
        failure = "failed: CUDA out of memory" if oom else "failed"
        record["status"] = "timed out" if record["train"]["timed_out"] else failure
        return
    trained = json.loads(summary_path.read_text())
    record["measured"] = {k: trained.get(k) for k in ("device", "peak_memory_rank0", "first_loss", "last_loss",
                                                      "tokens_per_s", "steps", "world_size")}
    expected = "cuda" if on_gpu else "cpu"
    record["status"] = "ok" if trained.get("device") == expected else f"failed: trained on {trained.get('device')}"
    record["comparison"] = compare(record["predicted"], trained.get("peak_memory_rank0", {}),
                                   record["nvidia_smi_memory"])


def compare(predicted: dict[str, Any], peak: dict[str, Any], smi: dict[str, Any] | None) -> dict[str, Any]:
    """measured / predicted for each measurement against the part of the prediction it can see."""

    def ratio(measured: Any, expected: int) -> float | None:
        return round(measured / expected, 3) if isinstance(measured, int) and expected > 0 else None

    used = smi.get("max_used_above_baseline_bytes") if smi else None
    return {
        "reserved_over_predicted_allocator": ratio(peak.get("max_reserved_bytes"), predicted["allocator_bytes"]),
        "allocated_over_predicted_tensors": ratio(peak.get("max_allocated_bytes"), predicted["tensor_bytes"]),
        "nvidia_smi_over_predicted_peak": ratio(used, predicted["peak_bytes"]),
    }


def speed_verdicts(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each DeepSpeed run's tokens/s against FSDP2's (fsdp-full) on the same model, batch,
    sequence and checkpointing: "ok" at SPEED_MIN_RATIO or more, "too slow" below it, "not
    measured" when either run has no rate (failed, timed out or skipped: its status says why)."""

    def key(record: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(record.get(k) for k in ("model", "micro_batch", "grad_accum", "seq_len", "ac"))

    def rate(record: dict[str, Any]) -> float | None:
        value = (record.get("measured") or {}).get("tokens_per_s")
        return float(value) if record.get("status") == "ok" and value else None

    fsdp = {key(r): r for r in records if r.get("strategy") == "fsdp-full" and r.get("backend") == "fsdp"}
    verdicts = []
    for record in records:
        base = fsdp.get(key(record))
        if record.get("backend") != "deepspeed" or base is None:
            continue
        mine, theirs = rate(record), rate(base)
        ratio = round(mine / theirs, 3) if mine is not None and theirs else None
        verdict = "not measured" if ratio is None else "ok" if ratio >= SPEED_MIN_RATIO else "too slow"
        verdicts.append({"case": record["case"], "fsdp_case": base["case"], "tokens_per_s": mine,
                         "fsdp_tokens_per_s": theirs, "ratio": ratio, "verdict": verdict,
                         "statuses": [record.get("status"), base.get("status")]})
    return verdicts


def speed_lines(verdicts: list[dict[str, Any]]) -> list[str]:
    """The speed section of summary.md: one line per DeepSpeed run with an FSDP2 run to compare."""
    if not verdicts:
        return []

    def rate(value: float | None) -> str:
        return f"{value:,.0f}" if value else "-"

    lines = ["", f"Rendered DeepSpeed file against FSDP2 (same model and batch; needs >= {SPEED_MIN_RATIO:.0%} "
             "of FSDP2's tokens/s):"]
    for v in verdicts:
        ratio = f"{v['ratio']:.0%}" if v["ratio"] is not None else "-"
        status = "" if v["verdict"] != "not measured" else f" (status: {' / '.join(map(str, v['statuses']))})"
        lines.append(f"- {v['case']}: {rate(v['tokens_per_s'])} tokens/s against {v['fsdp_case']} "
                     f"{rate(v['fsdp_tokens_per_s'])}: {ratio}, {v['verdict']}{status}")
    return lines


def gib(value: Any) -> str:
    return f"{value / GIB:.2f}" if isinstance(value, (int, float)) else "-"


def markdown(summary: dict[str, Any]) -> str:
    machine = summary.get("machine", {})
    torch_info = machine.get("torch") or {}
    lines = [
        "# GPU memory check: the plan's predicted peak against the trainer's measured peak", "",
        f"- status: {summary.get('status')}; started {summary.get('started')}; command `{shlex.join(summary['argv'])}`",
        f"- machine: {machine.get('nvidia_smi') or 'no nvidia-smi'}; torch {torch_info.get('version', 'missing')} "
        f"(CUDA {torch_info.get('cuda_build')}); deepspeed {machine.get('deepspeed') or 'not installed'}; "
        f"python {machine.get('python')}; {machine.get('cpu_count')} CPUs; commit {machine.get('git_commit')}",
        f"- model {summary.get('model')}; {summary.get('settings')}",
    ]  # fmt: skip
    lines += [f"- fallback: {reason}" for reason in summary.get("model_fallbacks", [])]
    lines += [
        "", "Predicted (GiB): the plan's peak; 'alloc' = peak - CUDA context - NCCL (what the caching allocator "
        "reserves); 'tensors' = alloc - fragmentation margin. Measured (GiB): the trainer's CUDA max reserved / "
        "max allocated (from the first step on), nvidia-smi's peak above the idle baseline (whole process). "
        "Ratios are measured / predicted.", "",
        "| case | backend | predicted peak | alloc | tensors | max reserved | reserved/alloc | max allocated "
        "| allocated/tensors | nvidia-smi | smi/peak | tokens/s (plan) | loss | status |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for record in summary.get("cases", []):
        pred = record.get("predicted") or {}
        meas = record.get("measured") or {}
        peak = meas.get("peak_memory_rank0") or {}
        comp = record.get("comparison") or {}
        smi = record.get("nvidia_smi_memory") or {}
        rate = meas.get("tokens_per_s")
        loss = f"{meas['first_loss']:.3f} -> {meas['last_loss']:.3f}" if meas.get("first_loss") is not None else "-"
        plan_rate = pred.get("tokens_per_s")
        lines.append(
            f"| {record.get('case', record['strategy'])} | {record['backend']} | {gib(pred.get('peak_bytes'))} "
            f"| {gib(pred.get('allocator_bytes'))} | {gib(pred.get('tensor_bytes'))} "
            f"| {gib(peak.get('max_reserved_bytes'))} | {comp.get('reserved_over_predicted_allocator') or '-'} "
            f"| {gib(peak.get('max_allocated_bytes'))} | {comp.get('allocated_over_predicted_tensors') or '-'} "
            f"| {gib(smi.get('max_used_above_baseline_bytes'))} | {comp.get('nvidia_smi_over_predicted_peak') or '-'} "
            f"| {f'{rate:,.0f}' if rate else '-'} ({f'{plan_rate:,.0f}' if plan_rate else '-'}) | {loss} "
            f"| {record.get('status')}{': ' + record['skipped'] if record.get('skipped') else ''} |"
        )
    lines += speed_lines(summary.get("speed", []))
    lines += sweep_lines(summary.get("gemm", []))
    notes = [note for record in summary.get("cases", []) for note in record.get("notes", [])]
    if notes:
        lines += ["", "Plan vs rendered file:"] + [f"- {note}" for note in notes]
    lines += ["", *(str(summary[key]) for key in ("note", "message") if summary.get(key))]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python3 scripts/gpu_train_check.py",
        description="The GPU memory check: the plan's predicted peak against the trainer's measured peak.",
    )
    p.add_argument("out_dir", type=Path, help="where summary.json, summary.md, logs.txt, artifacts.tar.gz go")
    p.add_argument("--steps", type=int, default=8, help="optimizer steps per run (default 8)")
    p.add_argument("--model", default=None, help="shipped recipe (default gpt2-1.5b; tiny with --rehearse-on-cpu)")
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--grad-accum", type=int, default=2)
    p.add_argument("--gpu", default="h200", help="the GPU type the plans are pinned to (default h200)")
    p.add_argument("--budget-s", type=float, default=420.0, help="stop starting work after this (default 420)")
    p.add_argument("--matrix", choices=("default", "calibration", "speed", "timeterms"), default="default",
                   help="default: four layouts of one model (with fallbacks); calibration: the planner's "
                        "calibration points (several models, AC policies, micro-batches), each planned on its own; "
                        "speed: FSDP2 and the rendered ZeRO-2 and ZeRO-3 files on the same model and batch; "
                        "timeterms: GEMM-shape sweeps (fstrain bench) and training runs of a small and a large "
                        "model at micro-batch 1 and 8")
    p.add_argument("--only", default="", help="comma list of case names (as in the table) to run, in that order")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="plan and render only; no trainer run, no GPU needed")
    mode.add_argument("--rehearse-on-cpu", action="store_true", help="run the trainer on the CPU (gloo): no GPU check")
    args = p.parse_args(argv)
    if args.steps < 2 or args.micro_batch < 1 or args.grad_accum < 1:
        p.error("--steps must be at least 2, --micro-batch and --grad-accum at least 1")
    args.model = args.model or ("tiny" if args.rehearse_on_cpu else "gpt2-1.5b")
    args.cases = {"calibration": CALIBRATION_CASES, "speed": SPEED_CASES, "timeterms": TIME_CASES}.get(args.matrix,
                                                                                                      CASES)
    if args.only:
        by_name = {case.name: case for case in args.cases}
        unknown = [name for name in args.only.split(",") if name not in by_name]
        if unknown:
            p.error(f"--only: no case {', '.join(unknown)} in the {args.matrix} matrix; cases: {', '.join(by_name)}")
        args.cases = tuple(by_name[name] for name in args.only.split(","))
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    out = args.out_dir.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for name in ("summary.json", "summary.md", "logs.txt", "artifacts.tar.gz"):
        (out / name).unlink(missing_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fstrain-gpu-train-check-"))
    check = Check(out, work, args.budget_s)
    signal.signal(signal.SIGTERM, _on_sigterm)
    code = 1
    try:
        code = steps(check, args)
    except (Exception, KeyboardInterrupt, Terminated) as exc:  # a blind run must still leave its summary
        check.summary["crashed"] = traceback.format_exc()
        check.summary["message"] = f"crashed or interrupted: {exc!r} (see crashed in summary.json)"
        code = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the files below must be written whole
        check.summary["exit_code"] = code
        check.summary.setdefault("status", "FAILED" if code == 1 else "NOT RUN" if code == 2 else "OK")
        check.save()
        (out / "summary.md").write_text(markdown(check.summary))
        with tarfile.open(out / "artifacts.tar.gz", "w:gz") as tar:
            tar.add(work, arcname="gpu-train-check")
        shutil.rmtree(work, ignore_errors=True)
    print((out / "summary.md").read_text())
    print(f"gpu_train_check: {check.summary['status']} (exit {code}): {check.summary.get('message', '')} "
          f"files in {out}", file=sys.stderr)
    return code


def steps(check: Check, args: argparse.Namespace) -> int:
    summary = check.summary
    summary["settings"] = (f"1 x {args.gpu}, bf16, adamw, AC none, offload none, micro-batch {args.micro_batch} "
                           f"x grad-accum {args.grad_accum}, {args.steps} steps")
    if args.matrix == "calibration":
        summary["settings"] = f"1 x {args.gpu}, bf16, adamw, offload none, {args.steps} steps; per case: see the table"
    if args.matrix == "speed":
        summary["settings"] += "; tokens/s of the rendered DeepSpeed files against FSDP2's"
    if args.matrix == "timeterms":
        summary["settings"] = (f"1 x {args.gpu}, bf16, adamw, AC none, offload none, {args.steps} steps; GEMM "
                               "sweeps, then training runs at micro-batch 1 and 8")
    summary["mode"] = "dry-run" if args.dry_run else "rehearse-on-cpu" if args.rehearse_on_cpu else "gpu"
    machine = summary["machine"] = record_machine(check)
    check.save()
    torch_info = machine.get("torch") or {}
    gpu_bytes = torch_info.get("total_memory_bytes") if torch_info.get("cuda_available") else None
    if args.matrix in ("calibration", "speed", "timeterms"):
        # Each case stands alone: one that cannot be planned or does not fit is recorded, the rest run.
        records = [plan_and_render(check, args.model, case, args) for case in args.cases]
        summary["cases"] = records
        summary["model"] = f"{args.matrix} matrix" if args.matrix in ("calibration", "timeterms") else args.model
        check.save()
        unplanned = [r for r in records if r["status"] != "rendered"]
        for record in unplanned:
            record["skipped"] = record["status"]
            record["status"] = "skipped" if record["status"] == "does not fit" else "failed"
        records = [r for r in records if r["status"] == "rendered"]
    else:
        model, records = choose_model(check, args, gpu_bytes)
        summary["model"] = model
        failed = [r for r in records if r["status"] != "rendered"]
        if failed:
            failures = "; ".join(f"{r['model']} {r['strategy']}: {r['status']}" for r in failed)
            summary["message"] = f"{failures} (see logs.txt)"
            return 1
    on_gpu = not args.rehearse_on_cpu
    sweeps = TIME_SWEEPS if args.matrix == "timeterms" else ()
    if args.dry_run:
        summary["gemm"] = [run_sweep(check, sweep, args, on_gpu) for sweep in sweeps]
        summary["status"] = "DRY RUN"
        summary["message"] = f"planned and rendered {len(records)} cases for {summary['model']}; no trainer run"
        return 0
    if not torch_info:
        summary["message"] = "not run: torch is not importable here (see probes/torch.log in logs.txt)"
        return 2
    if on_gpu and not torch_info.get("cuda_available"):
        summary["message"] = (f"not run: no CUDA GPU (torch {torch_info.get('version')} sees none; nvidia-smi: "
                              f"{machine.get('nvidia_smi') or 'none'}); plans and configs were rendered; "
                              "--dry-run stops there, --rehearse-on-cpu trains on the CPU")
        return 2
    summary["gemm"] = []
    for sweep in sweeps:
        summary["gemm"].append(run_sweep(check, sweep, args, on_gpu))
        check.save()
    for record in records:
        if args.rehearse_on_cpu and args.matrix == "timeterms" and record["model"] != "tiny":
            record["status"], record["skipped"] = "skipped", "a CPU rehearsal trains only tiny"
        elif record["backend"] == "deepspeed" and not machine.get("deepspeed"):
            record["status"], record["skipped"] = "skipped", "deepspeed is not importable here"
        elif check.left_s() - RESERVE_S < MIN_RUN_S:
            record["status"], record["skipped"] = "skipped", f"out of time ({check.left_s():.0f} s left)"
        else:
            train_case(check, record, args, on_gpu)
        check.save()
    records = summary["cases"]  # in the calibration matrix, the cases that could not be planned count too
    summary["speed"] = speed_verdicts(records)
    slow = [v for v in summary["speed"] if v["verdict"] == "too slow"]
    unmeasured = [v for v in summary["speed"] if v["verdict"] == "not measured"] if args.matrix == "speed" else []
    runs = [*records, *summary["gemm"]]  # training runs, then GEMM sweeps (timeterms)
    bad = [r for r in runs if r["status"] not in ("ok", "skipped")]
    ran = [r for r in runs if r["status"] == "ok"]
    if args.rehearse_on_cpu:
        summary["status"] = "REHEARSAL (CPU)" if not bad and ran else "FAILED"
        summary["note"] = "CPU rehearsal: the trainer measured peak RSS (measured in summary.json), not GPU memory"
    summary["message"] = (f"{len(ran)} run(s) ok, {len(bad)} failed, {len(runs) - len(ran) - len(bad)} skipped"
                          + (": " + ", ".join(f"{r.get('strategy') or r['sweep']} {r['status']}" for r in bad)
                             if bad else ""))
    if slow or unmeasured:
        summary["message"] += "; DeepSpeed against FSDP2: " + ", ".join(
            f"{v['case']} {v['verdict']}" + (f" ({v['ratio']:.0%})" if v["ratio"] is not None else "")
            for v in slow + unmeasured)
    if args.rehearse_on_cpu and (slow or unmeasured):
        # A CPU's rates say nothing about a GPU's: the rehearsal checks that the comparison runs.
        summary["note"] += "; the speed verdict needs a GPU, a CPU rehearsal only shows it is computed"
        slow, unmeasured = [], []
    return 1 if bad or not ran or slow or unmeasured else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
