"""Host lists at scale: `fstrain launch --dry-run --json` on 1,000 to 100,000 hosts.

    python benchmarks/hostlist_scale.py [--sizes 1000,10000,32000,100000] [--runs 1]

Each size runs twice per round, once with a hostfile of ``nodeNNNNNN slots=8`` lines and once
with ``--hosts 'node[000001-N]' --gpus-per-node 8``, as a separate process: wall seconds, CPU
seconds (user + system, which a loaded machine does not inflate as it does the wall clock) and
peak RSS, the medians of the rounds. The per-host columns are marginal: each figure's increase
from the size before, divided by the increase in hosts (the start-up, the same at every size,
drops out). Linear work costs the same per host at every size; the growth columns divide that
cost by the first step's, so 1.0 is linear and a step costing n^2 grows with the sizes (about 3
from 10,000-32,000 to 32,000-100,000 hosts). The output is checked: one JSON document, a node each.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line, median

REPO = Path(__file__).resolve().parents[1]


def run_once(argv: list[str], out_path: Path) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds and peak RSS (MB) of one run of ``argv``, stdout to ``out_path``."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with out_path.open("wb") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.PIPE, env=env, cwd=REPO)
        assert proc.stderr is not None
        err = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:6])} ... failed ({proc.returncode}): {err.decode()[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


# In a process of its own: a forked child's peak RSS starts from its parent's (Linux carries the
# high-water mark across exec), so this process stays small while it measures.
CHECK = """import json, sys
nodes = json.load(open(sys.argv[1]))["nodes"]
sys.exit(0 if len(nodes) == int(sys.argv[2]) and nodes[-1]["node_rank"] == len(nodes) - 1 else 1)
"""


def check_output(path: Path, count: int) -> None:
    if subprocess.run([sys.executable, "-c", CHECK, str(path), str(count)], check=False).returncode != 0:
        raise RuntimeError(f"the dry run's JSON does not hold {count} nodes: {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,32000,100000")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    sizes = [int(text) for text in args.sizes.split(",")]
    launch = [sys.executable, "-m", "fstrain", "launch", "--dry-run", "--json"]
    program = ["--", "python3", "train.py"]
    print(f"machine: {machine_line()}, load average {os.getloadavg()[0]:.1f} at the start")
    print(f"command: python benchmarks/hostlist_scale.py --sizes {args.sizes} --runs {args.runs}")
    print(f"{'form':9s} {'hosts':>7s} {'wall s':>7s} {'CPU s':>6s} {'peak MB':>8s} {'CPU us/host':>11s} "
          f"{'KB/host':>8s} {'CPU growth':>10s} {'RSS growth':>10s}")
    print(f"{'':43s}(marginal: from the size before)")
    with tempfile.TemporaryDirectory() as folder:
        out_path = Path(folder) / "out.json"
        for form in ("hostfile", "--hosts"):
            previous: tuple[int, float, float] | None = None
            first_step: tuple[float, float] | None = None
            for count in sizes:
                if form == "hostfile":
                    hostfile = Path(folder) / f"hosts{count}"
                    hostfile.write_text("".join(f"node{i:06d} slots=8\n" for i in range(1, count + 1)))
                    argv = [*launch, "--hostfile", str(hostfile), *program]
                else:
                    argv = [*launch, "--hosts", f"node[000001-{count:06d}]", "--gpus-per-node", "8", *program]
                runs = [run_once(argv, out_path) for _ in range(args.runs)]
                check_output(out_path, count)
                wall, cpu, rss = (median([run[i] for run in runs]) for i in range(3))
                line = f"{form:9s} {count:7d} {wall:7.2f} {cpu:6.2f} {rss:8.0f}"
                if previous is not None:
                    added = count - previous[0]
                    step = ((cpu - previous[1]) / added * 1e6, (rss - previous[2]) * 1024 / added)
                    first_step = first_step or step
                    ratios = (f"{now / first:10.2f}" if first > 0 else f"{'-':>10s}"
                              for now, first in zip(step, first_step, strict=True))
                    line += f" {step[0]:11.1f} {step[1]:8.2f} {' '.join(ratios)}"
                print(line, flush=True)
                previous = (count, cpu, rss)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
