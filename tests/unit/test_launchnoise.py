"""Folding torchrun's boilerplate on the terminal, on output captured from torchrun 2.13
(tests/fixtures/launch/*.txt: a rank exiting 3, and torchrun stopped with SIGTERM)."""

from __future__ import annotations

from pathlib import Path

from fstrain.core.monitor.logtail import split_rank_prefix
from fstrain.core.monitor.noise import MAX_BLOCK_LINES, NodeNoise

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "launch"


def shown(name: str) -> tuple[NodeNoise, list[str]]:
    noise = NodeNoise()
    out: list[str] = []
    for line in (FIXTURES / name).read_text().splitlines():
        out += noise.feed(*split_rank_prefix(line))
    return noise, out + noise.flush()


def test_child_failed_report_becomes_one_line_naming_the_rank() -> None:
    noise, out = shown("torchrun-child-failed.txt")
    assert noise.failed is not None
    assert (noise.failed.rank, noise.failed.local_rank, noise.failed.exit_code) == (1, 1, 3)
    assert "rank 1 exits 3 on purpose" in out  # the rank's own line stays
    assert out[-1] == "torchrun: rank 1 (local rank 1), exit 3, failed first (its report is in the log)"
    assert not any("Traceback" in line or "ChildFailedError" in line or line.startswith("  File") for line in out)


def test_signal_exception_on_teardown_and_the_node_rank_warning_are_folded() -> None:
    noise, out = shown("torchrun-signal.txt")
    assert out[-1] == "torchrun stopped by signal 15 (its traceback is in the log)"
    assert not any("node_rank is only used" in line or line.startswith("  File") for line in out)
    assert [line for line in out if line.startswith("ready rank=")] == ["ready rank=0 host=vm pid=10352 world=2",
                                                                       "ready rank=1 host=vm pid=10358 world=2"]
    assert noise.failed is None


def test_other_tracebacks_are_shown_whole() -> None:
    noise = NodeNoise()
    lines = ["Traceback (most recent call last):", '  File "x.py", line 1, in <module>', "    boom()",
             "ValueError: a real problem"]
    out = [shown for line in lines for shown in noise.feed(None, line)]
    assert out == lines


def test_an_unterminated_traceback_is_shown_at_the_end_or_when_too_long() -> None:
    noise = NodeNoise()
    assert noise.feed(None, "Traceback (most recent call last):") == []
    assert noise.feed(None, '  File "x.py", line 1') == []
    assert noise.flush() == ["Traceback (most recent call last):", '  File "x.py", line 1']
    long = [noise.feed(None, "Traceback (most recent call last):")]
    long += [noise.feed(None, "  frame") for _ in range(MAX_BLOCK_LINES)]
    assert sum(len(chunk) for chunk in long) == MAX_BLOCK_LINES + 1


def test_rank_lines_are_never_held_back_even_inside_a_launcher_block() -> None:
    noise = NodeNoise()
    noise.feed(None, "Traceback (most recent call last):")
    assert noise.feed(0, "step 3 loss 2.1") == ["step 3 loss 2.1"]


def test_teardown_of_the_other_nodes_folds_frame_dumps_and_chained_tracebacks() -> None:
    # node2's log (fstrain's own format) while node1 failed and fstrain stopped the job.
    noise = NodeNoise()
    out: list[str] = []
    for line in (FIXTURES / "teardown-other-node.log").read_text().splitlines():
        head, _, text = line.partition("] ")
        local_rank = int(head.split(" r")[1]) if " r" in head else None
        if "recvVector failed" in text:
            noise.stopping = True  # about when node1's failure reached fstrain
        out += noise.feed(local_rank, text)
    out += noise.flush()
    assert "ready rank=2 host=node2 pid=9732 world=4" in out
    assert not any(line.startswith(("frame #", "Traceback", "  File", "Exception raised")) for line in out)
    folded = [line for line in out if line.startswith("torchrun: ")]
    assert folded[-1] == ("torchrun: torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The "
                          "connection to the C10d store has failed. See inner exception for details. "
                          "(its traceback is in the log)")
    assert len(out) < 25, out


def test_a_lost_rendezvous_store_folds_even_before_the_launcher_stops() -> None:
    noise = NodeNoise()
    out: list[str] = []
    for line in (FIXTURES / "teardown-other-node.log").read_text().splitlines():
        head, _, text = line.partition("] ")
        out += noise.feed(int(head.split(" r")[1]) if " r" in head else None, text)
    out += noise.flush()
    assert not any(line.startswith(("frame #", "Traceback", "  File", "Exception raised")) for line in out)
    assert out[-1].startswith("torchrun: torch.distributed.elastic.rendezvous.api.RendezvousConnectionError")


def test_metric_lines_are_left_off_the_terminal_and_other_rank_lines_kept() -> None:
    noise = NodeNoise()
    lines = ['[default0]:FSTRAIN_METRICS {"v":1,"step":1,"loss":6.2}', "[default0]:[fstrain.train] step 1/20 loss 6.2",
             '  FSTRAIN_METRICS {"step": 2}', "[default1]:my FSTRAIN_METRICS note, mid-line"]
    out = [text for line in lines for text in noise.feed(*split_rank_prefix(line))]
    assert out == ["[fstrain.train] step 1/20 loss 6.2", "my FSTRAIN_METRICS note, mid-line"]
