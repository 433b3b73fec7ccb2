"""A rank that prints FSTRAIN_TEST_LINES numbered lines as fast as it can, then ``flood done``."""

from __future__ import annotations

import os
import sys

count = int(os.environ.get("FSTRAIN_TEST_LINES", "1000000"))
rank = os.environ.get("RANK", "0")
out = sys.stdout
chunk = 1000
for start in range(0, count, chunk):
    out.write("".join(f"flood rank={rank} line={i:07d} {'x' * 40}\n" for i in range(start, min(count, start + chunk))))
out.write(f"flood done rank={rank}\n")
out.flush()
