"""Every local path that moves output returns every line once and whole, under CPU contention:
the local transport (``run`` and ``start``), the watchdog's relay of per-rank log files, and the
launcher's bounded relay queue. (The SSH transport: tests/cluster/test_transport_integrity.py.)"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

from fstrain.io.relay import RelayQueue
from fstrain.io.transport.local import LocalTransport
from tests.integrity import CAT_TWICE, cpu_hogs, payload, payload_lines, started_lines

ROUNDS = int(os.environ.get("FSTRAIN_INTEGRITY_ROUNDS", "10"))
REPO = Path(__file__).resolve().parents[2]


def test_local_run_returns_every_byte_under_load(tmp_path: Path) -> None:
    text = payload(2_000_000)
    path = tmp_path / "out.txt"
    path.write_bytes(text.encode())
    transport = LocalTransport()
    with cpu_hogs(3):
        for _ in range(ROUNDS):
            result = transport.run([*CAT_TWICE, str(path)], timeout_s=120)
            assert result.ok
            assert result.stdout == text and result.stderr == text


def test_output_written_after_the_exit_is_still_returned(tmp_path: Path) -> None:
    """A process that outlives the command and holds its output: the output ends at end of file."""
    path = tmp_path / "late.txt"
    path.write_text("late line\n")
    result = LocalTransport().run(["sh", "-c", '(sleep 0.5; cat "$1") & exit 0', "sh", str(path)], timeout_s=30)
    assert (result.exit_code, result.stdout) == (0, "late line\n")


def test_local_start_yields_every_line_whole_under_load(tmp_path: Path) -> None:
    lines = payload_lines(2_000_000, seed=3)
    path = tmp_path / "lines.txt"
    path.write_bytes(("\n".join(lines) + "\n").encode())
    transport = LocalTransport()
    with cpu_hogs(3):
        for _ in range(max(1, ROUNDS // 2)):
            assert started_lines(transport, str(path)) == ((0, None), {"stdout": lines, "stderr": lines})


_TAILER = """
import sys, threading, time
from fstrain.io.remote.watchdog import RankLogTailer
tailer = RankLogTailer(sys.argv[1], int(sys.argv[2]))
thread = threading.Thread(target=tailer.follow, daemon=True)
thread.start()
sys.stdin.read()  # the writers are done
tailer.finish()
"""


def test_rank_log_tailer_relays_every_line_once_and_whole(tmp_path: Path) -> None:
    """DeepSpeed's per-rank log files, appended in random pieces (lines cut anywhere, 64 KiB
    lines), relayed by the watchdog while the files grow: each rank's lines, in order, once."""
    folder = tmp_path / "ranklogs"
    folder.mkdir()
    ranks = 4
    expected = {rank: payload_lines(400_000, seed=rank + 11) for rank in range(ranks)}
    out = tmp_path / "relayed.txt"
    with out.open("wb") as sink:
        tailer = subprocess.Popen([sys.executable, "-c", _TAILER, str(folder), str(ranks)], stdin=subprocess.PIPE,
                                  stdout=sink, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})

        def write(rank: int) -> None:
            data = ("\n".join(expected[rank]) + "\n").encode()
            chooser = random.Random(rank)
            with (folder / f"job_rank{rank}.log").open("ab", buffering=0) as handle:
                at = 0
                while at < len(data):
                    step = chooser.choice((1, 7, 100, 4096, 70000))
                    handle.write(data[at:at + step])
                    at += step
                    if chooser.random() < 0.05:
                        time.sleep(0.001)

        with cpu_hogs(2):
            writers = [threading.Thread(target=write, args=(rank,)) for rank in range(ranks)]
            for writer in writers:
                writer.start()
            for writer in writers:
                writer.join()
            assert tailer.stdin is not None
            tailer.stdin.close()
            assert tailer.wait(120) == 0
    got: dict[int, list[str]] = {rank: [] for rank in range(ranks)}
    for raw in out.read_bytes().split(b"\n")[:-1]:
        tag, _, line = raw.partition(b"]:")
        got[int(tag.removeprefix(b"[local"))].append(line.decode())
    for rank in range(ranks):
        assert got[rank] == expected[rank], f"rank {rank}: {len(got[rank])} lines of {len(expected[rank])}"


def test_relay_queue_passes_every_line_once_in_order_per_node() -> None:
    queue = RelayQueue(max_lines=64)  # small: the producers block on it most of the time
    nodes, count = 4, 20_000

    def produce(node: int) -> None:
        for number in range(count):
            queue.put(("line", node, "stdout", f"{node}:{number}"))
        queue.put(("exit", node, 0, None))

    producers = [threading.Thread(target=produce, args=(node,)) for node in range(nodes)]
    for producer in producers:
        producer.start()
    seen: dict[int, list[str]] = {node: [] for node in range(nodes)}
    exits = 0
    with cpu_hogs(2):
        while exits < nodes:
            kind, node, _, text = queue.get(timeout=60)
            if kind == "exit":
                exits += 1
            else:
                seen[node].append(text)
    for producer in producers:
        producer.join()
    assert all(seen[node] == [f"{node}:{n}" for n in range(count)] for node in range(nodes))
