"""A rank that reports three steps with the metric line (rank 3 is slow), then rank 3 exits 7:
what a user's own program shows in `fstrain report`, with nothing of fstrain imported."""

from __future__ import annotations

import json
import os
import sys
import time

rank = int(os.environ["RANK"])
for step in range(1, 4):
    line = {"step": step, "steps": 3, "loss": 5.0 / step, "step_s": 0.5 if rank == 3 else 0.1, "rank": rank}
    print("FSTRAIN_METRICS " + json.dumps(line), flush=True)
    time.sleep(0.2)
sys.exit(7 if rank == 3 else 0)
