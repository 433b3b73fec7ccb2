"""`fstrain logs RUN --tail 5` on a 1 GB attached-run log against `tail -n 5` of the same file.

Builds the run in a temporary folder (its own HOME with the index entry, RUN_DIR/manifest.json,
RUN_DIR/logs/localhost.log of tagged lines, as `fstrain launch` leaves them) and removes it at
the end. Runs alternate (fstrain, tail, tail, fstrain, ...) so drift hits both; each command's
wall time and peak RSS are reported as medians, with the ratio to `tail`. `python -c pass` is
measured too: the interpreter's start-up, which fstrain cannot beat. Both outputs are checked to
be the same five lines.

The peak RSS comes from GNU time (`/usr/bin/time -f %M`, package `time`): a child started by
this Python process itself would report this process's own RSS as its floor (Linux keeps the
high-water mark of the memory it had before exec). Without GNU time the peak is wait4's, and
the report says so.

    python benchmarks/logs_tail.py [--size-mb 1024] [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line, median

REPO = Path(__file__).resolve().parent.parent
RUN_ID = "20261201-120000-b10ca1"


def build_run(folder: Path, size_bytes: int) -> Path:
    """An attached run whose log is ``size_bytes`` of tagged lines; returns its HOME."""
    home, run_dir = folder / "home", folder / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "manifest.json").write_text(json.dumps({
        "run_id": RUN_ID, "reason": "ok", "exit_code": 0, "started": time.time() - 3600, "ended": time.time(),
        "nodes": [{"host": "localhost"}]}))
    index = home / ".fstrain" / "launched"
    index.mkdir(parents=True)
    (index / f"{RUN_ID}.json").write_text(json.dumps({"run_id": RUN_ID, "run_dir": str(run_dir), "detached": False,
                                                      "registered": time.time() - 3600, "client_pid": 0}))
    block = b"".join(b"[localhost r%d] [fstrain.train] step %d/1000000 loss %.4f tokens/s 51200\n"
                     % (step % 8, step, 3.0 - step * 1e-6) for step in range(12_000))
    with (run_dir / "logs" / "localhost.log").open("wb") as handle:
        written = 0
        while written < size_bytes:
            handle.write(block)
            written += len(block)
        for step in range(5):  # the last lines, each its own
            handle.write(b"[localhost r%d] [fstrain.train] last line %d\n" % (step, step))
    return home


GNU_TIME = "/usr/bin/time"


def measure(argv: list[str], env: dict[str, str], scratch: Path) -> tuple[float, float, str]:
    """Wall seconds, peak RSS (MB) and stdout of one run of ``argv``."""
    gnu_time = os.access(GNU_TIME, os.X_OK)
    report = scratch / "rss"
    command = [GNU_TIME, "-f", "%M", "-o", str(report), *argv] if gnu_time else argv
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO)
    assert proc.stdout is not None and proc.stderr is not None
    out, err = proc.stdout.read(), proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv} failed ({proc.returncode}): {err.decode(errors='replace')[-2000:]}")
    rss_kb = int(report.read_text().split()[-1]) if gnu_time else usage.ru_maxrss
    return seconds, rss_kb / 1024, out.decode(errors="replace")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="fstrain-bench-logs-"))
    try:
        home = build_run(folder, args.size_mb << 20)
        log = folder / "run" / "logs" / "localhost.log"
        env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO)}
        env.pop("FSTRAIN_DEBUG", None)
        cases = {"fstrain logs --tail 5": [sys.executable, "-m", "fstrain", "logs", RUN_ID, "--tail", "5"],
                 "tail -n 5": ["tail", "-n", "5", str(log)],
                 "python -c pass": [sys.executable, "-c", "pass"]}
        expected = measure(cases["tail -n 5"], env, folder)[2]  # also warms the page cache and pyc files
        assert expected.count("last line") == 5, expected
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
        for round_index in range(args.runs):
            order = list(cases) if round_index % 2 == 0 else list(reversed(cases))
            for name in order:
                seconds, rss_mb, out = measure(cases[name], env, folder)
                if name != "python -c pass" and out != expected:
                    raise RuntimeError(f"{name} printed {out!r}, tail printed {expected!r}")
                results[name].append((seconds, rss_mb))
        report(results, args, log.stat().st_size)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


def report(results: dict[str, list[tuple[float, float]]], args: argparse.Namespace, size_bytes: int) -> None:
    base_s = median([s for s, _ in results["tail -n 5"]])
    base_mb = median([m for _, m in results["tail -n 5"]])
    print(f"machine: {machine_line()}; load average {os.getloadavg()[0]:.2f}")
    print(f"command: python benchmarks/logs_tail.py --size-mb {args.size_mb} --runs {args.runs}")
    print(f"log: {size_bytes / 1e9:.2f} GB ({size_bytes:,} bytes); peak RSS from "
          + ("GNU time" if os.access(GNU_TIME, os.X_OK) else "wait4 (its floor is this benchmark's own RSS)"))
    print("| command | wall (median, s) | ratio | peak RSS (median, MB) | ratio | runs (s) |")
    print("|---|---|---|---|---|---|")
    for name, values in results.items():
        seconds, rss = median([s for s, _ in values]), median([m for _, m in values])
        runs = ", ".join(f"{s:.3f}" for s, _ in values)
        print(f"| {name} | {seconds:.3f} | {seconds / base_s:.1f} | {rss:.1f} | {rss / base_mb:.1f} | {runs} |")


if __name__ == "__main__":
    sys.exit(main())
