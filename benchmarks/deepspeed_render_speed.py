"""The rendered DeepSpeed config's step time against DeepSpeed's defaults and FSDP2, on CPU.

    python benchmarks/deepspeed_render_speed.py [--hidden 512] [--layers 4] [--steps 4] [--cases main]

Every case trains the same GPT-2-shaped model (learned positions, LayerNorm, biases, GELU, tied
embeddings) on the same batch with the bundled trainer's engines (fstrain.train), 2 processes
under torchrun with gloo; only the backend and the DeepSpeed file differ:

- ``defaults-zero2`` / ``defaults-zero3``: the fields a minimal user config must give (batch
  sizes, bf16, the optimizer block, the stage) and nothing else: every ZeRO knob is DeepSpeed's.
- ``rendered-zero2`` / ``rendered-zero3``: ``fstrain render``'s ds_config.json for the plan.
- ``fsdp2``: the FSDP2 backend, fsdp.yaml rendered from the same plan.
- ``previous-zero2`` / ``previous-zero3``: the rendered file with the bucket sizes ``fstrain
  render`` wrote before (hidden^2 elements, docs/configs.md "Why these ZeRO values").
- ``--cases bisect``: the rendered ZeRO-2 file with one field changed at a time.

Per case it reports the median over steps 2..N of every run (step 1 allocates buffers; with
``--repeats`` the cases run in turn, several times) of the wall time and of the CPU time of rank
0's process (all its threads: the step's work, which a loaded machine
stretches less than the wall time), and per step the gradient buckets DeepSpeed's ZeRO-1/2
reduces (``DeepSpeedZeroOptimizer.average_tensor`` calls: each a flatten, a collective and the
copies back, and with ``overlap_comm`` on a GPU a round trip between the compute stream and
the reduction stream) and the calls of torch.distributed's collectives (DeepSpeed's; FSDP2's functional collectives are
not counted). A CPU has no streams, so what these counts cost on a GPU is not measured here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line  # noqa: E402

from fstrain.core.plan.buckets import REDUCE_BUCKET_ELEMENTS  # noqa: E402
from fstrain.core.plan.planfile import PlanFile  # noqa: E402
from fstrain.core.plan.schema import ClusterSummary, ModelSpec, PlanKnobs  # noqa: E402
from fstrain.core.render.options import TrainingOptions  # noqa: E402
from fstrain.io.render_files import render_and_write  # noqa: E402

Config = dict[str, Any]
COLLECTIVES = ("all_reduce", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast")


def model_spec(hidden: int, layers: int, vocab: int, seq_len: int) -> ModelSpec:
    """GPT-2's shape at a size a CPU trains in seconds (GPT-2 1.5B: hidden 1600, 48 layers)."""
    return ModelSpec(
        name=f"gpt2-like-h{hidden}-l{layers}", num_layers=layers, hidden_size=hidden, num_heads=hidden // 64,
        num_kv_heads=hidden // 64, ffn_hidden_size=4 * hidden, activation="gelu", vocab_size=vocab,
        seq_len=seq_len, tied_embeddings=True, norm="layernorm", linear_bias=True, position_embedding="learned",
    )


def make_plan(spec: ModelSpec, stage: int, micro_batch: int, accum: int, world: int) -> PlanFile:
    knobs = PlanKnobs(
        strategy=f"zero{stage}", zero_stage=stage, dp=world, tp=1, pp=1, shard_group_size=world,
        micro_batch_size=micro_batch, grad_accum_steps=accum, precision="bf16",
    )
    cluster = ClusterSummary(num_nodes=1, gpus_per_node=world, gpu="h200", gpu_memory_bytes=141 * 2**30,
                             hosts=("localhost",))
    return PlanFile(model=spec, knobs=knobs, cluster=cluster)


def defaults_config(rendered: Config, stage: int) -> Config:
    """A minimal user config: what DeepSpeed cannot guess, and nothing it has a default for.

    The training itself stays the rendered file's (optimizer, schedule, gradient clipping): only
    the speed knobs go. The optimizer keeps ``torch_adam``: DeepSpeed's other AdamW (FusedAdam)
    is a CUDA kernel."""
    kept = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "optimizer",
            "scheduler", "gradient_clipping")
    minimal: Config = json.loads(json.dumps({key: rendered[key] for key in kept if key in rendered}))
    return {**minimal, "bf16": {"enabled": True}, "zero_optimization": {"stage": stage}}


def _zero(**fields: Any) -> Callable[[Config], Config]:
    def apply(config: Config) -> Config:
        copy: Config = json.loads(json.dumps(config))
        copy["zero_optimization"].update(fields)
        return copy
    return apply


def previous_rule(hidden: int, stage: int) -> Callable[[Config], Config]:
    """The bucket sizes fstrain render wrote before: the Hugging Face integration's "auto"
    values, hidden^2 elements (0.9 hidden^2 of prefetch, 10 hidden of persistence for stage 3)."""
    if stage == 3:
        return _zero(reduce_bucket_size=hidden * hidden, stage3_prefetch_bucket_size=int(0.9 * hidden * hidden),
                     stage3_param_persistence_threshold=10 * hidden)
    return _zero(reduce_bucket_size=hidden * hidden, allgather_bucket_size=hidden * hidden)


def bisect_cases(hidden: int) -> dict[str, Callable[[Config], Config]]:
    """The rendered ZeRO-2 file with one field changed at a time, and the previous rule's
    buckets with and without ``overlap_comm``."""
    square = {"reduce_bucket_size": hidden * hidden, "allgather_bucket_size": hidden * hidden}
    return {
        "rendered-zero2 overlap_comm=false": _zero(overlap_comm=False),
        "rendered-zero2 contiguous_gradients=false": _zero(contiguous_gradients=False),
        "rendered-zero2 hidden^2 buckets": _zero(**square),
        "rendered-zero2 hidden^2 buckets overlap_comm=false": _zero(**square, overlap_comm=False),
    }


# --- the worker: one rank of one case, under torchrun ---------------------------------------------

def buckets_per_micro_batch(numels_in_ready_order: list[int], bucket_elements: int) -> int:
    """Gradient reductions of one ZeRO-1/2 micro-batch: DeepSpeed 0.19.8 closes the bucket when
    the next gradient would not fit (stage_1_and_2.py line 1422), a larger gradient fills one on
    its own (line 1443), and the end of backward reduces what is left (line 1018)."""
    count = elements = 0
    for numel in numels_in_ready_order:
        if elements + numel > bucket_elements:
            count += 1 if elements else 0
            elements = 0
        elements += numel
    return count + (1 if elements else 0)


def recipe_buckets(recipe: str) -> str:
    """Buckets per micro-batch of the bundled trainer's model of ``recipe`` (built on the meta
    device: no memory) with buckets of hidden^2 and of DeepSpeed's default, gradients taken as
    ready in the reverse order of the parameters."""
    import torch

    from fstrain.io.recipes import load_shipped_recipe
    from fstrain.train.checkpointing import torch_checkpoint
    from fstrain.train.model import GPT

    spec = load_shipped_recipe(recipe).model
    with torch.device("meta"):
        model = GPT(spec, "none", torch_checkpoint, 1, False, False)
    numels = [p.numel() for p in reversed(list(model.parameters()))]
    bucket_sizes = {"hidden^2": spec.hidden_size**2, "DeepSpeed's default": REDUCE_BUCKET_ELEMENTS}
    counts = ", ".join(f"{buckets_per_micro_batch(numels, size):,} with {label} ({size:,} elements)"
                       for label, size in bucket_sizes.items())
    return f"{recipe} ({len(numels)} parameters): ZeRO-1/2 gradient buckets per micro-batch: {counts}"


def _count_calls(owner: Any, name: str, counter: Counter[str], key: str,
                 counts: Callable[..., bool] = lambda *args, **kwargs: True) -> None:
    original = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        if counts(*args, **kwargs):
            counter[key] += 1
        return original(*args, **kwargs)

    setattr(owner, name, counted)


def worker(args: argparse.Namespace) -> int:
    import torch.distributed as dist

    from fstrain.train.data import SyntheticData
    from fstrain.train.loop import build_engine
    from fstrain.train.runtime import all_reduce_mean, init_runtime
    from fstrain.train.runtime_env import world_size_from_env
    from fstrain.train.settings import load_settings

    config_flag = "--deepspeed-config" if args.backend == "deepspeed" else "--fsdp-config"
    settings = load_settings(["--plan", str(args.plan), "--backend", args.backend, config_flag, str(args.config),
                              "--steps", str(args.steps)], world_size_from_env())
    runtime = init_runtime()
    counts: Counter[str] = Counter()
    for name in COLLECTIVES:  # before the engine: DeepSpeed's ZeRO-3 keeps the functions it picks
        _count_calls(dist, name, counts, name)
    engine = build_engine(settings, runtime)
    if args.backend == "deepspeed":
        from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

        # An empty bucket (the one a gradient larger than the bucket finds) reduces nothing.
        _count_calls(DeepSpeedZeroOptimizer, "average_tensor", counts, "zero12_buckets",
                     lambda optimizer, tensor, *rest, **kwargs: tensor.numel() > 0)
    spec = settings.plan.model
    data = SyntheticData(spec.vocab_size, spec.seq_len, settings.seed)
    steps = []
    for step in range(args.steps):
        batches = [data.batch(step, m, runtime.rank, runtime.world_size, settings.micro_batch_size)
                   for m in range(settings.grad_accum_steps)]
        before = Counter(counts)
        wall, cpu = time.perf_counter(), time.process_time()
        loss, _ = engine.train_step(batches)
        loss = all_reduce_mean(loss, runtime.device)  # the step is done on every rank
        after = Counter(counts)
        after["all_reduce"] -= 1  # all_reduce_mean's own
        steps.append({"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu, "loss": loss,
                      "calls": dict(after - before)})
    if runtime.rank == 0:
        args.result.write_text(json.dumps(steps))
    dist.barrier()
    dist.destroy_process_group()
    return 0


# --- the driver ------------------------------------------------------------------------------------

def run_case(name: str, out: Path, backend: str, config: Config | None, steps: int, timeout_s: float) -> list[Any]:
    case_dir = out / "".join(c if c.isalnum() else "-" for c in name)
    case_dir.mkdir(parents=True)
    if backend == "deepspeed":
        (case_dir / "ds_config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        config_path = case_dir / "ds_config.json"
    else:
        config_path = out / "render-zero2" / "fsdp.yaml"
    result = case_dir / "result.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(Path(__file__).resolve()), "--worker", "--backend", backend, "--plan",
               str(out / "render-zero2" / "plan.yaml"), "--config", str(config_path), "--steps", str(steps),
               "--result", str(result)]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout_s,
                          check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: exited {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    steps_data: list[Any] = json.loads(result.read_text())
    return steps_data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--accum", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1, help="runs of every case, interleaved")
    parser.add_argument("--cases", default="main", help="main, bisect, or a comma-separated list of names")
    parser.add_argument("--timeout-s", type=float, default=600)
    parser.add_argument("--count-recipe", default="gpt2-1.5b",
                        help="a shipped recipe whose ZeRO-1/2 buckets per micro-batch are counted")
    # The worker's own arguments (one rank of one case, started by the driver under torchrun).
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--plan", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--config", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    spec = model_spec(args.hidden, args.layers, args.vocab, args.seq_len)
    options = TrainingOptions(warmup_steps=1, total_steps=args.steps)
    with tempfile.TemporaryDirectory(prefix="fstrain-ds-speed-") as tmp:
        out = Path(tmp)
        rendered: dict[int, Config] = {}
        for stage in (2, 3):
            bundle = out / f"render-zero{stage}"
            render_and_write(make_plan(spec, stage, args.micro_batch, args.accum, 2), bundle, force=False,
                             options=options)
            rendered[stage] = json.loads((bundle / "ds_config.json").read_text())
        bisect = bisect_cases(args.hidden)
        cases: dict[str, tuple[str, Config | None]] = {
            "defaults-zero2": ("deepspeed", defaults_config(rendered[2], 2)),
            "rendered-zero2": ("deepspeed", rendered[2]),
            "previous-zero2": ("deepspeed", previous_rule(args.hidden, 2)(rendered[2])),
            "defaults-zero3": ("deepspeed", defaults_config(rendered[3], 3)),
            "rendered-zero3": ("deepspeed", rendered[3]),
            "previous-zero3": ("deepspeed", previous_rule(args.hidden, 3)(rendered[3])),
            "fsdp2": ("fsdp", None),
            **{name: ("deepspeed", change(rendered[2])) for name, change in bisect.items()},
        }
        groups = {
            "main": ["defaults-zero2", "rendered-zero2", "previous-zero2", "defaults-zero3", "rendered-zero3",
                     "previous-zero3", "fsdp2"],
            "bisect": ["defaults-zero2", "rendered-zero2", *bisect],
        }
        names = groups.get(args.cases) or [name.strip() for name in args.cases.split(",")]
        unknown = sorted(set(names) - set(cases))
        if unknown:
            parser.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(cases)}")
        print(f"machine: {machine_line()}")
        print(f"command: python benchmarks/deepspeed_render_speed.py {' '.join(sys.argv[1:])}")
        print(recipe_buckets(args.count_recipe))
        print(f"model: {spec.name} (vocab {spec.vocab_size}, seq {spec.seq_len}), 2 ranks x micro-batch "
              f"{args.micro_batch} x accumulation {args.accum}, bf16, AdamW, {args.steps} steps x {args.repeats} "
              "run(s) per case; medians over steps 2..N of every run; x: CPU time against DeepSpeed's defaults "
              "for the stage")
        runs: dict[str, list[Any]] = {name: [] for name in names}
        for repeat in range(args.repeats):  # interleaved, so a change in the machine's load hits every case
            for name in names:
                backend, config = cases[name]
                steps = run_case(f"{name} {repeat}", out, backend, config, args.steps, args.timeout_s)
                runs[name] += steps[1:] if len(steps) > 1 else steps  # step 1 allocates buffers
                cpu_steps = ", ".join(f"{step['cpu_s']:.2f}" for step in steps)
                print(f"  {name} run {repeat + 1}: CPU s per step {cpu_steps}", file=sys.stderr, flush=True)
        base: dict[str, float] = {}
        for name in names:
            backend, _ = cases[name]
            steps = runs[name]
            wall, cpu = statistics.median(s["wall_s"] for s in steps), statistics.median(s["cpu_s"] for s in steps)
            stage = "zero3" if "zero3" in name else "zero2"
            if name.startswith("defaults-"):
                base[stage] = cpu
            ratio = f"x{cpu / base[stage]:4.2f}" if stage in base and backend == "deepspeed" else "     "
            calls = steps[-1]["calls"]
            # FSDP2 calls torch's functional collectives, which the counters do not see.
            counted = (f"{calls.get('zero12_buckets', 0):4d} ZeRO-1/2 gradient buckets, "
                       f"{sum(v for k, v in calls.items() if k in COLLECTIVES):4d} collectives"
                       if backend == "deepspeed" else "collectives not counted")
            print(f"{name:48s} wall {wall:6.2f} s  cpu {cpu:6.2f} s {ratio}  per step: {counted}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
