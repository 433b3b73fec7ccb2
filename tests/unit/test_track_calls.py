"""What a launch sends its experiment trackers, on values (fstrain/core/track/calls.py): the
parameters, every rank's step numbers from its lines (each once), the events, the run's status."""

from __future__ import annotations

import json
import math

from fstrain.core.monitor.metricline import StepMetrics, format_metric_line
from fstrain.core.runs.runevents import RunEvent
from fstrain.core.track.calls import (
    MAX_PARAM_CHARS,
    Point,
    StepFeed,
    event_lines,
    event_tags,
    launch_params,
    step_points,
    tracker_status,
)

PLAN = {"fstrain_plan": 1, "model": {"name": "llama3.1-8b", "layers": 32},
        "plan": {"strategy": "fsdp-full", "zero_stage": 3, "dp": 8, "tp": 2, "pp": 1, "micro_batch_size": 2,
                 "grad_accum_steps": 4, "precision": "bf16", "flash_attention": True, "hosts_list": ["a", "b"]},
        "cluster": {"hosts": ["a", "b"]}, "predicted": {"tokens_per_s": 1.0}}


def test_params_name_the_launch_and_the_plans_knobs() -> None:
    params = launch_params("r1", "torchrun", ["node1", "node2"], [8, 8], ["python", "train.py", "--lr", "3e-4"], PLAN)
    assert params == {"run_id": "r1", "backend": "torchrun", "nodes": "2", "nproc_per_node": "8", "world_size": "16",
                      "hosts": "node1,node2", "program": "python train.py --lr 3e-4", "model": "llama3.1-8b",
                      "strategy": "fsdp-full", "zero_stage": "3", "dp": "8", "tp": "2", "pp": "1",
                      "micro_batch_size": "2", "grad_accum_steps": "4", "precision": "bf16",
                      "flash_attention": "True"}


def test_params_of_a_program_without_a_plan_and_uneven_nodes_and_long_values() -> None:
    hosts = [f"node{i:04d}" for i in range(200)]
    params = launch_params("r2", "deepspeed", hosts, [8] * 199 + [4], [], None)
    assert params["nproc_per_node"] == ",".join(["8"] * 199 + ["4"])
    assert len(params["hosts"]) == MAX_PARAM_CHARS and params["hosts"].endswith("...")
    assert params["world_size"] == str(8 * 199 + 4) and "program" not in params and "model" not in params


def test_step_points_rank_zero_twice_others_once_non_numbers_left_out() -> None:
    metrics = StepMetrics(step=7, loss=2.5, lr=3e-4, tokens_per_s=1000.0, step_s=0.5, memory_bytes=2**30, rank=0,
                          time=1700000000.0, extra={"grad_norm": 1.25, "note": "text", "flag": True})
    zero = step_points(0, metrics, 5.0)
    keys = [p.key for p in zero]
    assert keys == ["rank0/loss", "rank0/lr", "rank0/tokens_per_s", "rank0/step_s", "rank0/memory_bytes",
                    "rank0/grad_norm", "loss", "lr", "tokens_per_s", "step_s", "memory_bytes", "grad_norm"]
    assert {p.step for p in zero} == {7} and {p.time_s for p in zero} == {1700000000.0}
    assert Point("memory_bytes", float(2**30), 7, 1700000000.0) in zero
    three = step_points(3, StepMetrics(step=2, loss=math.nan, tokens_per_s=50.0, scope="rank"), 9.0)
    assert three == [Point("rank3/tokens_per_s_rank", 50.0, 2, 9.0)]


def test_the_feed_reads_every_format_status_reads_and_sends_each_number_once() -> None:
    feed = StepFeed()
    line = format_metric_line(StepMetrics(step=1, loss=2.0, tokens_per_s=10.0, rank=1))
    assert [p.key for p in feed.line(f"[node2 r1] {line}", 1.0)] == ["rank1/loss", "rank1/tokens_per_s"]
    assert feed.line(f"[node2 r1] {line}", 2.0) == []  # the same step again: nothing new
    assert feed.line("[node2] torchrun: starting 2 workers", 2.0) == []  # the launcher's own line
    assert feed.line("[node2 r1] [fstrain.train] step 1/5 loss 9.0 tokens/s 5", 2.0) == []  # a metric line won
    # DeepSpeed's two lines of one step add up: the learning rate, then the samples/s.
    first = feed.line("[node1 r0] [Rank 0] step=10, skipped=0, lr=[0.001], mom=[(0.9, 0.999)]", 3.0)
    assert [(p.key, p.value, p.step) for p in first] == [("rank0/lr", 0.001, 10), ("rank0/skipped_steps", 0.0, 10),
                                                         ("lr", 0.001, 10), ("skipped_steps", 0.0, 10)]
    second = feed.line("[node1 r0] epoch=0/micro_step=20/global_step=10, RunningAvgSamplesPerSec=31.5, "
                       "CurrSamplesPerSec=32.0, MemAllocated=0.1GB, MaxMemAllocated=0.2GB", 4.0)
    assert {p.key for p in second} == {"rank0/samples_per_s", "rank0/avg_samples_per_s",
                                       "rank0/max_memory_allocated_bytes", "samples_per_s", "avg_samples_per_s",
                                       "max_memory_allocated_bytes"}
    titan = feed.line("[node1 r0] step: 11  loss:  7.91250  grad_norm:  1.2000  memory: 9.46GiB(64.99%)  "
                      "tps: 7,282  tflops: 0.52  mfu: 0.17%", 5.0)
    assert ("loss", 7.9125, 11) in [(p.key, p.value, p.step) for p in titan]
    assert ("rank0/tokens_per_s_rank", 7282.0, 11) in [(p.key, p.value, p.step) for p in titan]


def test_a_metric_line_names_its_rank_over_the_tag_and_untagged_lines_need_one() -> None:
    feed = StepFeed()
    named = format_metric_line(StepMetrics(step=3, loss=1.0, rank=5))
    assert [p.key for p in feed.line(f"[node1 r0] {named}", 1.0)] == ["rank5/loss"]
    assert [p.key for p in feed.line(f"[node1] {format_metric_line(StepMetrics(step=4, loss=1.0, rank=6))}", 1.0)] \
        == ["rank6/loss"]
    assert feed.line(f"[node1] {format_metric_line(StepMetrics(step=4, loss=1.0))}", 1.0) == []


def test_a_resumed_rank_sends_the_steps_after_its_checkpoint_again() -> None:
    feed = StepFeed()
    for step in (1, 2, 3):
        feed.line(f"[n r2] {format_metric_line(StepMetrics(step=step, loss=float(step)))}", 1.0)
    again = feed.line(f"[n r2] {format_metric_line(StepMetrics(step=2, loss=2.5))}", 2.0)
    assert again == [Point("rank2/loss", 2.5, 2, 2.0)]


def test_status_of_each_end() -> None:
    assert tracker_status(0, "ok") == "FINISHED"
    assert [tracker_status(130, r) for r in ("interrupted", "terminated", "cancelled", "stopped")] == ["KILLED"] * 4
    assert tracker_status(1, "failed") == tracker_status(137, "lost") == tracker_status(None, "failed") == "FAILED"


def test_events_sum_up_as_tags_and_go_out_as_their_files_lines() -> None:
    events = [RunEvent("started", 1.0, "r1", 1, "attempt 1 on node1, node2", hosts=("node1", "node2")),
              RunEvent("failure", 2.0, "r1", 1, "rank 3 on node2 exited with 7", host="node2", rank=3, exit_code=7),
              RunEvent("excluded", 3.0, "r1", 1, "node2 left out", host="node2", evidence="sshd gone"),
              RunEvent("attempt", 4.0, "r1", 2, "attempt 2 on node1, node3", hosts=("node1", "node3")),
              RunEvent("finished", 9.0, "r1", 2, "succeeded", state="succeeded", exit_code=0)]
    assert event_tags(events[:2]) == {"fstrain.attempts": "1", "fstrain.failures": "1",
                                      "fstrain.last_event": "rank 3 on node2 exited with 7"}
    assert event_tags(events) == {"fstrain.attempts": "2", "fstrain.failures": "1", "fstrain.excluded": "node2",
                                  "fstrain.last_event": "succeeded", "fstrain.state": "succeeded",
                                  "fstrain.exit_code": "0"}
    assert event_tags([]) == {}
    lines = event_lines(events, "9.9")
    assert [RunEvent.from_dict(json.loads(line), "x") for line in lines] == events
    assert json.loads(lines[1])["format"] == 1 and json.loads(lines[1])["fstrain"] == "9.9"
