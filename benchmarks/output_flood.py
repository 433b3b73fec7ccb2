"""A flood of output through `fstrain launch`: fstrain's peak memory and pace, and every line counted.

Numbers, not a test (tests/cluster/test_launch_output.py keeps the property at a small size: 80 MB
in 40,000 long lines to a reader that stalls). Here one rank on this machine (`--nproc-per-node
1 --backend deepspeed`, no SSH: the relay from the watchdog's pipe to stdout is the same)
prints --lines numbered 75-byte lines as fast as it can (tests/cluster/programs/flood.py), and
fstrain's stdout goes to a file, as a user's `> out.txt` does. Reported per run: wall seconds
from start to exit, fstrain's peak RSS (VmHWM, sampled every 0.1 s), the lines found in the file
against those written, lines a second over the whole run; then the medians. Needs torch and
deepspeed (the launcher).

    python benchmarks/output_flood.py [--lines 1000000] [--runs 3]
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

REPO = Path(__file__).resolve().parent.parent
FLOOD = REPO / "tests" / "cluster" / "programs" / "flood.py"


def peak_rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def one_run(folder: Path, lines: int) -> dict[str, float]:
    out_path = folder / "stdout.txt"
    env = {**os.environ, "FSTRAIN_TEST_LINES": str(lines), "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "fstrain", "launch", "--nproc-per-node", "1", "--backend", "deepspeed",
            "--run-dir", str(folder / "run"), "--", "python3", str(FLOOD)]
    started = time.monotonic()
    with out_path.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.DEVNULL, env=env, cwd=REPO)
        peak = 0.0
        while proc.poll() is None:
            peak = max(peak, peak_rss_mib(proc.pid))
            time.sleep(0.1)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"fstrain launch exited {proc.returncode}")
    found = 0
    with out_path.open("rb") as handle:
        for line in handle:
            found += b" flood rank=0 line=" in line
    return {"wall_s": wall, "peak_mib": peak, "lines": found, "lines_per_s": found / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(machine_line())
    print(f"one rank, {args.lines:,} lines of 75 bytes, fstrain's stdout to a file")
    print("| run | wall (s) | peak RSS (MiB) | lines found | lines/s |")
    print("|---|---|---|---|---|")
    rows = []
    for number in range(1, args.runs + 1):
        with tempfile.TemporaryDirectory(prefix="fstrain-flood-") as folder:
            row = one_run(Path(folder), args.lines)
        rows.append(row)
        print(f"| {number} | {row['wall_s']:.1f} | {row['peak_mib']:.0f} | {int(row['lines']):,} of {args.lines:,} "
              f"| {row['lines_per_s']:,.0f} |", flush=True)
    print(f"| median | {median([r['wall_s'] for r in rows]):.1f} | {median([r['peak_mib'] for r in rows]):.0f} "
          f"| | {median([r['lines_per_s'] for r in rows]):,.0f} |")


if __name__ == "__main__":
    main()
