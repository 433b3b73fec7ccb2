"""A rank for the hang tests: every rank joins a gloo group and does one all_reduce, then rank
FSTRAIN_TEST_HANG_RANK blocks forever (sleeps) while the others either wait for it in a second
all_reduce (FSTRAIN_TEST_OTHERS=collective) or finish with exit 0 (FSTRAIN_TEST_OTHERS=exit)."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
value = torch.ones(1)
dist.all_reduce(value)
print(f"step 1 rank={rank} sum={int(value.item())}", flush=True)
if rank == int(os.environ.get("FSTRAIN_TEST_HANG_RANK", "1")):
    print(f"rank {rank} blocks forever", flush=True)
    while True:
        time.sleep(3600)
if os.environ.get("FSTRAIN_TEST_OTHERS", "collective") == "collective":
    dist.all_reduce(value)  # waits for the blocked rank
print(f"done rank={rank}", flush=True)
# Leave without the interpreter's shutdown: tearing down a gloo group whose peer is blocked can
# abort the process ("terminate called without an active exception"), and this rank is meant
# to have finished cleanly.
os._exit(0)
