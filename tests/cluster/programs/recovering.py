"""A rank for the recovery tests: trains nothing, but keeps steps and checkpoints as a trainer does.

It reads FSTRAIN_CHECKPOINT_DIR and FSTRAIN_RESTART (what fstrain gives every rank of a run with
a recovery policy), resumes after the newest ``step_N`` folder there, prints per step one metric
line and ``line rank=R attempt=A step=S`` (the tests count them), and rank 0 writes a ``step_N``
folder every ``--checkpoint-every`` steps. Faults: ``--raise-at-step S`` raises on every rank
(an application error); ``--exit-at-step S --exit-code C --exit-host H`` exits with C on host H's
ranks at the attempt's S-th step, in every attempt or (``--first-attempt-only``) only in the first;
``--hang-at-step S`` with ``--exit-host H`` sleeps there instead (a hung rank).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--step-s", type=float, default=0.5)
parser.add_argument("--checkpoint-every", type=int, default=3)
parser.add_argument("--raise-at-step", type=int, default=0)
parser.add_argument("--exit-at-step", type=int, default=0)
parser.add_argument("--exit-code", type=int, default=3)
parser.add_argument("--exit-host", default="")
parser.add_argument("--hang-at-step", type=int, default=0)
parser.add_argument("--first-attempt-only", action="store_true")
args = parser.parse_args()

rank = int(os.environ["RANK"])
attempt = int(os.environ["FSTRAIN_RESTART"])
folder = os.environ["FSTRAIN_CHECKPOINT_DIR"]
host = socket.gethostname()
os.makedirs(folder, exist_ok=True)
done = [int(n[5:]) for n in (os.listdir(folder) if os.path.isdir(folder) else []) if n.startswith("step_")]
start = max(done) if done else 0
print(f"start rank={rank} attempt={attempt} host={host} step={start} world={os.environ.get('WORLD_SIZE')}",
      flush=True)
for step in range(start + 1, args.steps + 1):
    time.sleep(args.step_s)
    if args.raise_at_step == step:
        # Every rank gets here before any raises (a file barrier: the test hosts share a disk), as
        # the ranks of a real job meet in a collective before each step.
        open(os.path.join(folder, f".at{step}.rank{rank}"), "w").close()
        while sum(n.startswith(f".at{step}.") for n in os.listdir(folder)) < int(os.environ["WORLD_SIZE"]):
            time.sleep(0.05)
        raise RuntimeError(f"rank {rank} fails at step {step} on purpose")
    if args.hang_at_step == step - start and host == args.exit_host and not (args.first_attempt_only and attempt):
        print(f"rank {rank} hangs at step {step} on purpose", flush=True)
        time.sleep(3600)
    if args.exit_at_step == step - start and host == args.exit_host and not (args.first_attempt_only and attempt):
        print(f"rank {rank} exits {args.exit_code} at step {step} on purpose", flush=True)
        sys.exit(args.exit_code)
    print(f"line rank={rank} attempt={attempt} step={step}", flush=True)
    print("FSTRAIN_METRICS " + json.dumps({"step": step, "steps": args.steps, "loss": 1.0 / step}), flush=True)
    if rank == 0 and step % args.checkpoint_every == 0:
        os.makedirs(os.path.join(folder, f"step_{step:07d}"), exist_ok=True)
print(f"done rank={rank} attempt={attempt}", flush=True)
