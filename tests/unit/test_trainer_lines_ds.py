"""Trainers' own step lines read by metricline.read_step (TRAINER_FORMATS): DeepSpeed's engine and
ThroughputTimer lines, torchtitan's and Megatron-LM's, as the real programs printed them
(tests/fixtures/trainer-output/SOURCES.md says where each line comes from), and no other line
read as theirs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fstrain.core.monitor.metricline import (
    GIB,
    METRIC_LINE,
    PROGRESS_LINE,
    TRAINER_FORMATS,
    StepMetrics,
    format_metric_line,
    newer_reading,
    newer_step,
    read_deepspeed_step,
    read_deepspeed_throughput,
    read_megatron,
    read_step,
    read_torchtitan,
)
from fstrain.core.monitor.promfile import NodeMetrics
from fstrain.core.report.series import rank_series

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
OUTPUT = FIXTURES / "trainer-output"
MINE = {"DeepSpeed engine": read_deepspeed_step, "DeepSpeed ThroughputTimer": read_deepspeed_throughput,
        "torchtitan": read_torchtitan, "Megatron-LM": read_megatron}
MY_FIXTURES = ("deepspeed-engine.txt", "torchtitan-step.txt", "torchtitan-step-2025.txt", "megatron-iteration.txt",
               "megatron-iteration-epfllm.txt")


def lines_of(name: str) -> list[str]:
    return (OUTPUT / name).read_text().splitlines()


def read_all_of(name: str, source: str) -> list[StepMetrics]:
    """The readings of a fixture's lines that come from ``source``."""
    found = []
    for line in lines_of(name):
        reading = read_step(line)
        if reading is not None and reading.source == source:
            found.append(reading.metrics)
    return found


def read_all(name: str, source: str) -> list[StepMetrics]:
    """The readings of a fixture's lines, each checked to come from ``source``."""
    found = []
    for line in lines_of(name):
        reading = read_step(line)
        if reading is not None:
            assert reading.source == source, line
            found.append(reading.metrics)
    return found


def test_my_formats_are_in_the_tuple_read_step_tries() -> None:
    assert {name: read for name, read in TRAINER_FORMATS if name in MINE} == MINE


# --- DeepSpeed --------------------------------------------------------------------------------

def test_deepspeed_engine_lines_among_everything_else_it_printed() -> None:
    lines = lines_of("deepspeed-engine.txt")
    readings = [(line, read_step(line)) for line in lines]
    found = [(reading.source, reading.metrics) for _, reading in readings if reading is not None]
    engine = [m for source, m in found if source == "DeepSpeed engine"]
    timer = [m for source, m in found if source == "DeepSpeed ThroughputTimer"]
    assert len(found) == len(engine) + len(timer) and len(lines) > 100
    # step 0 is the line deepspeed.initialize prints; the WarmupLR schedule's rates as printed
    assert [m.step for m in engine] == [0, 1, 2, 3, 4, 5, 6]
    assert [m.lr for m in engine] == [0.0, 0.0, 0.00025, 0.0005, 0.00075, 0.001, 0.001]
    assert {m.rank for m in engine} == {0}
    assert {m.extra["skipped_steps"] for m in engine} == {0}
    assert {(m.loss, m.tokens_per_s) for m in engine} == {(None, None)}


def test_deepspeed_throughput_timer_lines() -> None:
    timer = read_all_of("deepspeed-engine.txt", "DeepSpeed ThroughputTimer")
    # the timer starts measuring at its start_step (2): its first line is global step 3
    assert [m.step for m in timer] == [3, 4, 5, 6]
    assert [m.extra["samples_per_s"] for m in timer] == [3319.8881434873933, 2134.356888426918, 4826.519432391269,
                                                         2222.2806875280908]
    assert [m.extra["avg_samples_per_s"] for m in timer] == [3320.577140029688, 2598.7013630731103,
                                                             3071.4376029779705, 2803.7377117670408]
    assert {m.extra["max_memory_allocated_bytes"] for m in timer} == {round(0.33 * GIB)}
    assert {(m.tokens_per_s, m.loss, m.lr, m.memory_bytes) for m in timer} == {(None, None, None, None)}


def test_deepspeed_step_line_learning_rate_as_a_tensor_or_numpy_value() -> None:
    line = next(line for line in lines_of("deepspeed-engine.txt") if "step=2, skipped=0" in line)
    for printed in ("tensor(0.00025)", "np.float64(0.00025)", "0.00025, 2.5e-05"):
        metrics = read_deepspeed_step(line.replace("lr=[0.00025]", f"lr=[{printed}]"))
        assert metrics is not None and metrics.step == 2 and metrics.lr == 0.00025
    metrics = read_deepspeed_step(line.replace("lr=[0.00025]", "lr=[]"))
    assert metrics is not None and metrics.step == 2 and metrics.lr is None


# --- torchtitan -------------------------------------------------------------------------------

def test_torchtitan_step_lines_with_grad_norm() -> None:
    found = read_all("torchtitan-step.txt", "torchtitan")
    assert [m.step for m in found] == [14, 15, 16, 17, 18]
    assert [m.loss for m in found] == [3.24405, 3.10680, 3.05047, 3.14459, 3.54399]
    assert [m.tokens_per_s for m in found] == [7282.0, 7334.0, 7313.0, 7282.0, 7322.0]
    assert {m.scope for m in found} == {"rank"}  # torchtitan's tps is per device
    assert {m.memory_bytes for m in found} == {round(9.46 * GIB)}
    assert [m.extra["grad_norm"] for m in found] == [0.8319, 0.8587, 0.5443, 0.5303, 0.7675]
    assert found[1].extra == {"grad_norm": 0.8587, "tflops": 0.53, "mfu_pct": 0.17}
    assert {m.lr for m in found} == {None}  # the line carries none


def test_torchtitan_2025_lines_among_its_other_lines() -> None:
    lines = lines_of("torchtitan-step-2025.txt")
    found = read_all("torchtitan-step-2025.txt", "torchtitan")
    assert [m.step for m in found] == [200, 210, 220, 230, 240, 250]
    assert [m.loss for m in found] == [6.1384, 6.0388, 6.0348, 5.9670, 5.8311, 5.8383]
    assert [m.tokens_per_s for m in found] == [5856.0, 5593.0, 5868.0, 5869.0, 5864.0, 5862.0]
    assert found[0].extra == {"tflops": 339.16, "mfu_pct": 34.29}  # before torchtitan logged grad_norm
    assert "Dumping profiler traces at step 200" in lines[2] and read_step(lines[2]) is None


def colour(line: str) -> str:
    """The line as torchtitan prints it on a terminal: each field behind the colour code
    torchtitan/components/metrics.py puts before it (torchtitan/tools/utils.py Color), reset at
    the end. The fixtures' sources pasted the lines without their codes."""
    codes = {"step": "\033[31m", "loss": "\033[32m", "grad_norm": "\033[38;2;180;60;0m",
             "memory": "\033[38;2;54;234;195m", "tps": "\033[34m", "tflops": "\033[36m", "mfu": "\033[35m"}
    for field, code in codes.items():
        line = re.sub(rf"\b{field}: ", code + field + ": ", line, count=1)
    return line + "\033[39m"


@pytest.mark.parametrize("name", ["torchtitan-step.txt", "torchtitan-step-2025.txt"])
def test_torchtitan_colour_codes_change_nothing(name: str) -> None:
    for line in lines_of(name):
        coloured = colour(line)
        assert read_torchtitan(coloured) == read_torchtitan(line)
        if read_torchtitan(line) is not None:
            assert "\033[31mstep: " in coloured and coloured != line


def test_torchtitan_validation_line_is_not_a_training_step() -> None:
    # metrics.py log_validation's format, with the numbers of the 2026 fixture's step 14
    line = ("[rank0]:[titan] 2026-05-18 16:04:46,338 - root - INFO - \033[33mvalidate step: 14  "
            "\033[32mloss:  3.2441  \033[38;2;54;234;195mmemory:  9.46GiB(64.99%)  \033[34mtps: 7,282\033[39m")
    assert read_torchtitan(line) is None
    assert read_step(line) is None


def test_torchtitan_without_mfu_under_fp8() -> None:
    line = lines_of("torchtitan-step.txt")[0].replace("mfu: 0.17%", "mfu: N/A")
    metrics = read_torchtitan(line)
    assert metrics is not None and metrics.step == 14 and "mfu_pct" not in metrics.extra


# --- Megatron-LM ------------------------------------------------------------------------------

def test_megatron_iteration_lines() -> None:
    found = read_all("megatron-iteration.txt", "Megatron-LM")
    assert [m.step for m in found] == [71, 72, 73]
    assert {m.steps for m in found} == {100}
    assert [m.loss for m in found] == [1.818812, 1.820313, 1.798953]
    assert [m.lr for m in found] == [1.42e-05, 1.44e-05, 1.46e-05]
    assert [m.step_s for m in found] == pytest.approx([5.3616, 5.4707, 5.8299])
    assert {m.tokens_per_s for m in found} == {None}  # samples, not tokens
    assert found[0].extra == {"consumed_samples": 9088, "global_batch_size": 128, "grad_norm": 1.3,
                              "loss_scale": 1.0, "tflops": 243.6, "skipped_iterations": 0, "nan_iterations": 0}


def test_megatron_iteration_lines_of_an_older_fork() -> None:
    found = read_all("megatron-iteration-epfllm.txt", "Megatron-LM")
    assert [m.step for m in found] == [122, 123, 124, 125]
    assert {m.steps for m in found} == {250000}
    assert [m.loss for m in found] == [2.50422, 2.493043, 2.559583, 2.477393]
    assert [m.lr for m in found] == [9.15e-06, 9.225e-06, 9.3e-06, 9.375e-06]
    assert [m.step_s for m in found] == pytest.approx([86.5452, 87.8716, 89.4748, 89.0752])
    assert [m.extra["consumed_samples"] for m in found] == [124928, 125952, 126976, 128000]
    assert "tflops" not in found[0].extra


def test_megatron_line_of_a_model_whose_loss_has_another_name() -> None:
    line = lines_of("megatron-iteration.txt")[0].replace("| lm loss:", "| mtp_1 loss:")
    metrics = read_megatron(line)
    assert metrics is not None and metrics.step == 71 and metrics.loss is None and metrics.lr == 1.42e-05


# --- No false positives ---------------------------------------------------------------------

def other_lines() -> list[str]:
    """Every line of every other fixture: logs, nvidia-smi, ibstat, torchrun failures, the bundled
    trainer's own output, other trainers' lines."""
    found = []
    for path in sorted(FIXTURES.rglob("*")):
        if path.is_file() and path.name not in MY_FIXTURES and path.suffix != ".py":
            found.extend(path.read_text(errors="replace").splitlines())
    return found


def test_no_line_of_any_other_fixture_is_read_as_one_of_these_trainers() -> None:
    lines = other_lines()
    assert len(lines) > 10_000
    assert any(line.startswith("[fstrain.train] step ") for line in lines)
    assert any(line.startswith("Traceback (most recent call last):") for line in lines)
    assert [(name, line) for line in lines for name, read in MINE.items() if read(line) is not None] == []


@pytest.mark.parametrize("line", [
    "[fstrain.train] step 1/4 loss 11.1449 lr 0.000e+00 tokens/s 694 max_allocated_bytes=32746.2MiB",
    format_metric_line(StepMetrics(step=3, loss=2.5, lr=1e-4, tokens_per_s=900.0, step_s=0.2)),
    "{'loss': 2.3017, 'grad_norm': 1.5346, 'learning_rate': 4.8e-05, 'epoch': 0.04}",
    "{'train_runtime': 12.3, 'train_samples_per_second': 5.2, 'train_steps_per_second': 0.65, 'train_loss': 2.2}",
    "Traceback (most recent call last):",
    '  File "/usr/lib/python3.11/site-packages/deepspeed/runtime/engine.py", line 3555, in step',
    "RuntimeError: step=3, skipped=1 is not what I expected",
    "step: 4 loss: 2.1",  # step and loss alone: no tps
    "iteration 10/100 | lm loss: 2.0 |",  # no consumed samples
    "",
])
def test_other_lines_are_not_trainer_lines(line: str) -> None:
    assert [name for name, read in MINE.items() if read(line) is not None] == []
    reading = read_step(line)
    assert reading is None or reading.source in (METRIC_LINE, PROGRESS_LINE)


def test_each_of_my_fixture_lines_is_read_by_one_reader_only() -> None:
    for name in MY_FIXTURES:
        for line in lines_of(name):
            assert len([n for n, read in MINE.items() if read(line) is not None]) <= 1, line


def test_a_metric_line_still_wins_over_a_trainer_line() -> None:
    held = None
    for line in lines_of("torchtitan-step.txt")[:2]:
        held = newer_step(held, line)
    assert held is not None and held.source == "torchtitan" and held.metrics.step == 15
    held = newer_step(held, format_metric_line(StepMetrics(step=15, loss=3.1)))
    assert held is not None and held.source == METRIC_LINE
    assert newer_step(held, lines_of("torchtitan-step.txt")[2]) is held


# --- What the report and the textfile make of them --------------------------------------------

def test_the_report_takes_the_step_time_and_memory_a_trainer_line_gives() -> None:
    (megatron,) = rank_series(lines_of("megatron-iteration.txt"), tokens_per_step=128 * 4096)
    assert [p.step_s for p in megatron.points] == pytest.approx([5.3616, 5.4707, 5.8299])  # not tokens / samples
    assert [p.loss for p in megatron.points] == [1.818812, 1.820313, 1.798953]
    (titan,) = rank_series(lines_of("torchtitan-step.txt"), tokens_per_step=8 * 8192)
    assert {p.memory_bytes for p in titan.points} == {round(9.46 * GIB)}
    assert {p.step_s for p in titan.points} == {None}  # a rank's tps over the job's tokens would be no step time


def textfile_of(name: str) -> str:
    """The Prometheus textfile of a one-rank node whose rank printed the fixture's lines."""
    node = NodeMetrics("r1", "node1", 0, 1, 0, started=100.0, read_step=read_step, newer_reading=newer_reading)
    for line in lines_of(name):
        node.line(None, line, 101.0)
    return node.render(102.0)


def test_the_textfile_labels_torchtitans_tokens_per_second_as_the_ranks() -> None:
    text = textfile_of("torchtitan-step.txt")
    assert re.search(r'^fstrain_tokens_per_second\{[^}]*scope="rank"[^}]*\} 7322(\.0)?$', text, re.M), text
    assert re.search(r"^fstrain_step\{[^}]*\} 18(\.0)?$", text, re.M), text


def test_deepspeeds_two_lines_of_a_step_add_up() -> None:
    held = None
    for line in lines_of("deepspeed-engine.txt"):
        held = newer_step(held, line)
    assert held is not None and held.source == "DeepSpeed ThroughputTimer"
    assert (held.metrics.step, held.metrics.lr, held.metrics.rank) == (6, 0.001, 0)
    assert held.metrics.extra["samples_per_s"] == 2222.2806875280908 and held.metrics.extra["skipped_steps"] == 0
    text = textfile_of("deepspeed-engine.txt")
    assert re.search(r"^fstrain_learning_rate\{[^}]*\} 0\.001$", text, re.M), text
    assert re.search(r"^fstrain_step\{[^}]*\} 6(\.0)?$", text, re.M), text


def test_a_line_of_another_step_does_not_carry_the_last_ones_numbers() -> None:
    held = None
    for line in lines_of("torchtitan-step-2025.txt")[:3]:  # step 200, then "Dumping profiler traces at step 200"
        held = newer_step(held, line)
    assert held is not None and (held.metrics.step, held.metrics.loss) == (200, 6.1384)
    held = newer_step(held, "[rank0]: step 201/300")
    assert held is not None and (held.metrics.step, held.metrics.loss, held.metrics.tokens_per_s) == (201, None, None)
