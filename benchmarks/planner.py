"""Planner timings: the full search in-process, and `fstrain plan` end to end (not a test).

    python benchmarks/planner.py [--runs 10]

Targets (issue 4): a full search for a 405B model on 1,024 GPUs under 1 s; `fstrain plan` for a
70B model on 64 GPUs under 0.5 s including process start. Runs are interleaved across cases and
reported as best and median: on a shared 2-core machine the best run is the one least disturbed
by other load, the median says how often that happens.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line, median, time_command

SEARCHES = {  # name: (recipe, nodes of 8 GPUs, GPU)
    "search llama3.1-405b, 128x8 h100-sxm (1,024 GPUs)": ("llama3.1-405b", 128, "h100-sxm"),
    "search llama3.1-70b, 8x8 h100-sxm (64 GPUs)": ("llama3.1-70b", 8, "h100-sxm"),
    "search mixtral-8x7b, 64x8 h200 (512 GPUs)": ("mixtral-8x7b", 64, "h200"),
}
PLAN_70B = ["plan", "--model", "llama3.1-70b", "--num-nodes", "8", "--gpu", "h100-sxm"]
COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "fstrain plan (70B, 64 GPUs, tables)": [sys.executable, "-m", "fstrain", *PLAN_70B],
    "fstrain plan (70B, 64 GPUs, --json)": [sys.executable, "-m", "fstrain", *PLAN_70B, "--json"],
    "fstrain plan (405B, 1,024 GPUs, --json)": [
        *(sys.executable, "-m", "fstrain", "plan", "--model", "llama3.1-405b"),
        *("--num-nodes", "128", "--gpu", "h100-sxm", "--json"),
    ],
}
TARGETS = {
    "search llama3.1-405b, 128x8 h100-sxm (1,024 GPUs)": 1.0,
    "fstrain plan (70B, 64 GPUs, tables)": 0.5,
    "fstrain plan (70B, 64 GPUs, --json)": 0.5,
}


def search(recipe: str, nodes: int, gpu: str) -> Callable[[], float]:
    """One full search, timed from a cold cache of the planner (what a CLI run does)."""
    from fstrain.core.plan.plancluster import uniform_cluster
    from fstrain.core.plan.planner import PlanModel, TrainingSpec, plan
    from fstrain.io.recipes import load_shipped_recipe

    loaded = load_shipped_recipe(recipe)
    seq = loaded.model.seq_len
    batch = loaded.training.global_batch_size or (loaded.training.global_batch_tokens or 4 << 20) // seq

    def run() -> float:
        start = time.perf_counter()
        result = plan(PlanModel.from_spec(loaded.model), TrainingSpec(seq, batch), uniform_cluster(nodes, 8, gpu))
        seconds = time.perf_counter() - start
        assert result.plans, recipe
        return seconds

    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    searches = {name: search(*case) for name, case in SEARCHES.items()}
    for argv in COMMANDS.values():
        time_command(argv)  # warm the page cache and pyc files
    times: dict[str, list[float]] = {name: [] for name in (*SEARCHES, *COMMANDS)}
    for _ in range(args.runs):
        for name, run in searches.items():
            times[name].append(run())
        for name, argv in COMMANDS.items():
            times[name].append(time_command(argv)[0])
    print(f"machine: {machine_line()}")
    print(f"command: python benchmarks/planner.py --runs {args.runs}\n")
    print("| case | best (s) | median (s) | target |")
    print("|---|---|---|---|")
    for name, values in times.items():
        target = TARGETS.get(name)
        verdict = f"< {target} s: {'met' if min(values) < target else 'MISSED'}" if target else ""
        print(f"| {name} | {min(values):.3f} | {median(values):.3f} | {verdict} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
