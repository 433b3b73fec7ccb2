"""Every local path that moves output returns every line once and whole, under CPU contention:
the local transport (``run`` and ``start``), the watchdog's relay of per-rank log files, and the
launcher's bounded relay queue. (The SSH transport: tests/cluster/test_transport_integrity.py.)"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fstrain.core.job.spec import SCRIPT_FLAGS
from fstrain.io.relay import RelayQueue
from fstrain.io.remote import source
from fstrain.io.remote.watchdog import BOOTSTRAP, EVENT_PREFIX, rank_source
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


def append_in_pieces(path: Path, data: bytes, seed: int) -> None:
    """``data`` appended to ``path`` as a rank writes: pieces of random sizes (lines cut
    anywhere, 64 KiB lines), now and then a pause."""
    chooser = random.Random(seed)
    with path.open("ab", buffering=0) as handle:
        at = 0
        while at < len(data):
            step = chooser.choice((1, 7, 100, 4096, 70000))
            handle.write(data[at:at + step])
            at += step
            if chooser.random() < 0.05:
                time.sleep(0.001)


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
            append_in_pieces(folder / f"job_rank{rank}.log", data, seed=rank)

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


def _tagged(data: bytes) -> dict[int, list[bytes]]:
    got: dict[int, list[bytes]] = {}
    for raw in data.split(b"\n")[:-1]:
        tag, _, line = raw.partition(b"]:")
        got.setdefault(int(tag.removeprefix(b"[local")), []).append(line)
    return got


def test_rank_log_tailer_follows_torchrun_files_across_restarts(tmp_path: Path) -> None:
    """torchrun's --redirects layout: stdout.log to stdout, stderr.log to stderr, each rank's lines
    once and whole in attempt order, bytes as written; a half line of an attempt that a restart
    ended goes out (with a newline) when the next attempt appears, the last one at the end."""
    folder = tmp_path / "ranklogs"
    expected: dict[str, dict[int, list[bytes]]] = {"stdout.log": {}, "stderr.log": {}}
    with (tmp_path / "out").open("wb") as out, (tmp_path / "err").open("wb") as err:
        tailer = subprocess.Popen([sys.executable, "-c", _TAILER, str(folder), "2"], stdin=subprocess.PIPE,
                                  stdout=out, stderr=err, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})

        def write(attempt: int, local: int, name: str) -> None:
            lines = [line.encode() for line in payload_lines(300_000, seed=attempt * 10 + local + 20)]
            lines.insert(1, b"bad \xff\xfe bytes")
            half = b"half line of attempt %d" % attempt
            expected[name].setdefault(local, []).extend([*lines, half])
            data = b"\n".join(lines) + b"\n" + half
            rank_dir = folder / "run1_abc" / f"attempt_{attempt}" / str(local)
            rank_dir.mkdir(parents=True, exist_ok=True)
            append_in_pieces(rank_dir / name, data, seed=attempt * 10 + local)

        for attempt in (0, 1):  # torchrun starts attempt 1's ranks after attempt 0's have ended
            writers = [threading.Thread(target=write, args=(attempt, local, name))
                       for local in (0, 1) for name in ("stdout.log", "stderr.log")]
            for writer in writers:
                writer.start()
            for writer in writers:
                writer.join()
            time.sleep(0.5)  # the tailer relays what is whole before the next attempt (the end)
        assert tailer.stdin is not None
        tailer.stdin.close()
        assert tailer.wait(120) == 0
    assert _tagged((tmp_path / "out").read_bytes()) == expected["stdout.log"]
    assert _tagged((tmp_path / "err").read_bytes()) == expected["stderr.log"]


@pytest.mark.parametrize(("relative", "source"), [
    ("job_rank5.log", (1, 1, 0)),  # DeepSpeed: global rank 5, 2 per node -> local 1
    ("run_x1/attempt_0/3/stdout.log", (3, 1, 0)),
    ("run_x1/attempt_12/0/stderr.log", (0, 2, 12)),
    ("run_x1/attempt_0/3/error.json", None),
    ("run_x1/attempt_0/filtered_stdout.log", None),
    ("job_rankx.log", None),
    ("sub/job_rank1.log", None),
])
def test_rank_source_names_the_launchers_files(relative: str, source: tuple[int, int, int] | None) -> None:
    assert rank_source(relative, 4 if relative.startswith("run") else 2) == source


def test_deepspeed_local_ranks_count_from_the_nodes_first_rank() -> None:
    # Nodes of 3 and 1 ranks: the second node's only rank is global rank 3, its local rank 0.
    assert rank_source("job_rank3.log", 1, rank_offset=3) == (0, 1, 0)
    assert rank_source("job_rank4.log", 3, rank_offset=0) == (1, 1, 0)  # not this node's: still relayed
    assert [rank_source(f"job_rank{r}.log", 3, rank_offset=0) for r in range(3)] == [(r, 1, 0) for r in range(3)]


# A job whose launcher prints 200 KiB lines on its own stdout while its rank writes 200 KiB
# lines to its log file: the watchdog's stdout carries both.
_TWO_WRITERS = """
import os, sys, threading
folder = os.path.join(os.environ["FSTRAIN_RUN_DIR"], "ranklogs")
os.makedirs(folder, exist_ok=True)
def rank():
    with open(os.path.join(folder, "job_rank0.log"), "ab", buffering=0) as handle:
        for number in range(40):
            handle.write(b"rank %d " % number + b"r" * 200000 + b"\\n")
writer = threading.Thread(target=rank)
writer.start()
for number in range(40):
    sys.stdout.buffer.write(b"launcher %d " % number + b"l" * 200000 + b"\\n")
    sys.stdout.buffer.flush()
writer.join()
"""


def test_the_launchers_own_lines_never_land_inside_a_rank_line(tmp_path: Path) -> None:
    """The watchdog's stdout is a pipe, and a pipe keeps a write whole only up to 4 KiB: the
    launcher's output comes through the watchdog too, one whole line at a time."""
    header = {"source": source("watchdog"), "argv": [sys.executable, "-c", _TWO_WRITERS], "env": {},
              "run_dir": str(tmp_path / "run"), "rank_log_dir": "{run_dir}/ranklogs", "nproc": 1, "grace_s": 2}
    watchdog = subprocess.Popen([sys.executable, *SCRIPT_FLAGS, "-c", BOOTSTRAP], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert watchdog.stdin is not None
    watchdog.stdin.write((json.dumps(header) + "\n").encode())
    watchdog.stdin.flush()
    read: dict[str, bytes] = {}
    readers = [threading.Thread(target=lambda name=name, stream=stream: read.update({name: stream.read()}))
               for name, stream in (("out", watchdog.stdout), ("err", watchdog.stderr))]
    for reader in readers:
        reader.start()
    with cpu_hogs(2):
        code = watchdog.wait(120)  # stdin open until then: its end would stop the job
    watchdog.stdin.close()
    for reader in readers:
        reader.join(30)
    for stream in (watchdog.stdout, watchdog.stderr):
        if stream is not None:
            stream.close()
    assert code == 0, read["err"][-2000:]
    lines = read["out"].split(b"\n")
    assert lines.pop() == b""
    assert sorted(lines) == sorted([b"launcher %d " % n + b"l" * 200000 for n in range(40)]
                                   + [b"[local0]:rank %d " % n + b"r" * 200000 for n in range(40)])


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


# A rank as transformers' Trainer writes under torchrun --redirects 3: a real tqdm bar redrawn
# with "\r" in stderr.log (one line until the bar closes), a log dict now and then in
# stdout.log; then it says when it wrote the bar's newline.
_BAR_RANK = """
import os, sys, time
from tqdm import tqdm
rank_dir = os.path.join(os.environ["FSTRAIN_RUN_DIR"], "ranklogs", "run_x", "attempt_0", "0")
os.makedirs(rank_dir)
with open(os.path.join(rank_dir, "stdout.log"), "w", buffering=1) as out, \\
        open(os.path.join(rank_dir, "stderr.log"), "w", buffering=1) as err:
    bar = tqdm(total=12, file=err, mininterval=0)
    for step in range(1, 13):
        time.sleep(0.25)
        bar.update(1)
        if step % 4 == 0:
            out.write("{'loss': '%.3f', 'learning_rate': '0.001'}\\n" % (5 - step / 4))
            out.flush()
    bar.close()
print(time.time(), flush=True)
"""


def test_a_bars_draws_reach_the_step_readers_live_and_its_line_is_relayed_once_whole(tmp_path: Path) -> None:
    """A "\\r" ends no line: the bar's line goes out once, whole, bytes as written, when its
    newline comes; its draws reach the launcher before that, as events, each a draw of a later
    step, none of them in the output."""
    from fstrain.core.monitor.metricline import read_transformers_trainer

    header = {"source": source("watchdog"), "argv": [sys.executable, "-c", _BAR_RANK], "env": {},
              "run_dir": str(tmp_path / "run"), "rank_log_dir": "{run_dir}/ranklogs", "nproc": 1, "grace_s": 2}
    watchdog = subprocess.Popen([sys.executable, *SCRIPT_FLAGS, "-c", BOOTSTRAP], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert watchdog.stdin is not None and watchdog.stdout is not None and watchdog.stderr is not None
    watchdog.stdin.write((json.dumps(header) + "\n").encode())
    watchdog.stdin.flush()
    arrived: list[tuple[float, bytes]] = []  # each line of the watchdog's stdout, when it came
    err: list[bytes] = []
    reader = threading.Thread(target=lambda: arrived.extend((time.time(), line.rstrip(b"\n"))
                                                            for line in watchdog.stdout))
    err_reader = threading.Thread(target=lambda: err.append(watchdog.stderr.read()))
    reader.start()
    err_reader.start()
    code = watchdog.wait(60)
    watchdog.stdin.close()
    reader.join(10)
    err_reader.join(10)
    watchdog.stdout.close()
    watchdog.stderr.close()
    assert code == 0, err
    mark = EVENT_PREFIX.encode()
    events = [(at, json.loads(line[len(mark):])) for at, line in arrived if line.startswith(mark)]
    output = [line for _, line in arrived if not line.startswith(mark)]
    (newline_at,) = [float(line) for line in output if line[:1].isdigit()]  # the job's own stdout: no tag
    rank_dir = tmp_path / "run" / "ranklogs" / "run_x" / "attempt_0" / "0"
    written = {name: (rank_dir / name).read_bytes() for name in ("stdout.log", "stderr.log")}
    assert written["stderr.log"].count(b"\r") >= 12 and written["stderr.log"].count(b"\n") == 1
    relayed_err = [line for line in err[0].split(b"\n")[:-1] if not line.startswith(b"fstrain-watchdog")]
    assert relayed_err == [b"[local0]:" + written["stderr.log"][:-1]]
    assert [line for line in output if b"'loss'" in line] == \
        [b"[local0]:" + line for line in written["stdout.log"].split(b"\n")[:-1]]
    draws = [(at, event["draw"]) for at, event in events if "draw" in event]
    steps = [read_transformers_trainer(draw["text"]) for _, draw in draws]
    live = [found.step for (at, _), found in zip(draws, steps, strict=True) if found is not None and at < newline_at]
    assert len(live) >= 2 and live == sorted(set(live)), (live, draws)
    assert all(draw["local"] == 0 and draw["fd"] == 2 and "\n" not in draw["text"] for _, draw in draws)
