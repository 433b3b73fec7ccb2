"""CLI start-up: `fstrain --help` (and other non-training commands) against a bare `python -c pass`.

    python benchmarks/startup.py [--runs 20]

Reports medians and the ratio to the interpreter's own start-up, which no CLI can beat.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line, median, time_command

CASES = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "fstrain --help": [sys.executable, "-m", "fstrain", "--help"],
    "fstrain exec --help": [sys.executable, "-m", "fstrain", "exec", "--help"],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    for argv in CASES.values():
        time_command(argv)  # warm the page cache and pyc files
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.runs):
        for name, argv in CASES.items():
            times[name].append(time_command(argv)[0])
    base = median(times["python -c pass"])
    print(f"machine: {machine_line()}")
    print(f"command: python benchmarks/startup.py --runs {args.runs}")
    for name, values in times.items():
        print(f"{name:24s} median {median(values) * 1000:6.0f} ms   x{median(values) / base:4.2f} of python -c pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
