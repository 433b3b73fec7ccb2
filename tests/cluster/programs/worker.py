"""A rank for the launch tests: says it is ready, then does what FSTRAIN_TEST_FAULT asks.

Environment: FSTRAIN_TEST_FAULT = "" (sleep FSTRAIN_TEST_SECONDS, exit 0) | "exit<N>" | "sigkill" | "segv"
(applied on global rank FSTRAIN_TEST_FAULT_RANK, after every rank said ready),
FSTRAIN_TEST_ECHO=1 to print argv and selected environment values as JSON, and
FSTRAIN_TEST_IGNORE_TERM=1 to ignore SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time

rank = int(os.environ.get("RANK", "0"))
if os.environ.get("FSTRAIN_TEST_IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a rank that will not stop politely
print(f"ready rank={rank} host={socket.gethostname()} pid={os.getpid()} world={os.environ.get('WORLD_SIZE')}",
      flush=True)
if os.environ.get("FSTRAIN_TEST_ECHO"):
    names = os.environ.get("FSTRAIN_TEST_ECHO_NAMES", "").split(",")
    print(json.dumps({"argv": sys.argv[1:], "env": {n: os.environ.get(n) for n in names if n}}), flush=True)
fault = os.environ.get("FSTRAIN_TEST_FAULT", "")
if fault and rank == int(os.environ.get("FSTRAIN_TEST_FAULT_RANK", "1")):
    time.sleep(float(os.environ.get("FSTRAIN_TEST_FAULT_AFTER", "2")))
    if fault.startswith("exit"):
        print(f"rank {rank} exits {fault[4:]} on purpose", flush=True)
        sys.exit(int(fault[4:]))
    if fault == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "segv":
        print(f"rank {rank} segfaults on purpose", flush=True)
        os.kill(os.getpid(), signal.SIGSEGV)
time.sleep(float(os.environ.get("FSTRAIN_TEST_SECONDS", "600")))
print(f"done rank={rank}", flush=True)
