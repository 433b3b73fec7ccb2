"""A rank whose output is not all UTF-8: a line with invalid bytes, then plain lines (for `fstrain
logs`: every line after it must keep its rank tag). Sleeps FSTRAIN_TEST_SECONDS between them, so a
follower reads them in separate reads."""

from __future__ import annotations

import os
import time

rank = int(os.environ.get("RANK", "0"))
pause_s = float(os.environ.get("FSTRAIN_TEST_SECONDS", "3"))
os.write(1, b"rank %d bad bytes \xff\xfe\xfd\xc3 here\n" % rank)  # one write each: ranks may share a pipe
time.sleep(pause_s)
for line in range(3):
    os.write(1, b"after rank=%d line=%d\n" % (rank, line))
time.sleep(pause_s)
os.write(1, b"done rank=%d\n" % rank)
