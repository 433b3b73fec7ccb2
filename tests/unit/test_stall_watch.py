"""The attached launcher's stall watch on a fake clock: when it asks for stacks, and what it writes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from fstrain.io.stall import StallWatch

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "stacks"


@dataclass
class FakeNode:
    done: bool = False
    exit_code: int | None = None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_stall_is_due_once_after_the_last_rank_line(tmp_path: Path) -> None:
    clock = Clock()
    watch = StallWatch(20, None, tmp_path, clock=clock)
    nodes = [FakeNode(), FakeNode()]
    clock.now += 100
    assert watch.due(nodes) == ""  # no rank has printed yet
    watch.progress()
    clock.now += 19
    assert watch.due(nodes) == ""
    clock.now += 1
    assert watch.due(nodes) == "no rank printed anything for 20 s"
    assert watch.due(nodes) == ""  # asked once


def test_finish_timeout_starts_when_a_rank_is_gone(tmp_path: Path) -> None:
    clock = Clock()
    watch = StallWatch(None, 30, tmp_path, clock=clock)
    nodes = [FakeNode(), FakeNode()]
    watch.event(1, {"ranks_gone": [2]})
    clock.now += 30
    assert watch.due(nodes).startswith("some ranks finished 30 s ago")


def test_collects_every_live_node_then_writes_the_report(tmp_path: Path) -> None:
    clock = Clock()
    watch = StallWatch(20, None, tmp_path, clock=clock)
    watch.reason = "no rank printed anything for 20 s"
    watch.requested([0, 1])
    dump = {r: (FIXTURES / f"faulthandler_gloo-allreduce-hang_rank{r}.txt").read_text() for r in (0, 1, 2)}
    watch.event(0, {"stacks": {"ranks": {"0": {"faulthandler": dump[0]}, "1": {"faulthandler": dump[1]}}}})
    assert not watch.collected()
    watch.event(1, {"stacks": {"ranks": {"2": {"faulthandler": dump[2]}}, "nccl_traces": []}})
    assert watch.collected()
    document = watch.write()
    assert document["odd_ranks"] == [1] and document["unanswered_nodes"] == []
    assert json.loads((tmp_path / "stacks" / "report.json").read_text()) == document
    assert (tmp_path / "stacks" / "rank1.faulthandler.txt").read_text() == dump[1]


def test_a_silent_node_does_not_block_the_report_forever(tmp_path: Path) -> None:
    clock = Clock()
    watch = StallWatch(20, None, tmp_path, clock=clock)
    watch.reason = "no rank printed anything for 20 s"
    watch.requested([0, 1])
    watch.event(0, {"stacks": {"ranks": {}}})
    clock.now += 31
    assert watch.collected()
    assert watch.write()["unanswered_nodes"] == [1]
