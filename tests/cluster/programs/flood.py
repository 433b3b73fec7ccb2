"""A rank that prints FSTRAIN_TEST_LINES numbered lines as fast as it can, then ``flood done``; each
line carries FSTRAIN_TEST_PAD bytes of padding (default 40: 75-byte lines)."""

from __future__ import annotations

import os
import sys

count = int(os.environ.get("FSTRAIN_TEST_LINES", "1000000"))
rank = os.environ.get("RANK", "0")
pad = "x" * int(os.environ.get("FSTRAIN_TEST_PAD", "40"))
out = sys.stdout
chunk = 1000
for start in range(0, count, chunk):
    out.write("".join(f"flood rank={rank} line={i:07d} {pad}\n" for i in range(start, min(count, start + chunk))))
out.write(f"flood done rank={rank}\n")
out.flush()
