"""Trainers' own output read as a rank's step (fstrain.core.monitor.metricline.TRAINER_FORMATS):
real output of transformers' and Lightning's Trainer (tests/fixtures/trainer-output, SOURCES.md
there), checked against what those runs logged themselves, and lines that must not be read."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from fstrain.api.report import report
from fstrain.core.monitor.metricline import (
    MAX_LINE_BYTES,
    METRIC_LINE,
    PROGRESS_LINE,
    TRAINER_FORMATS,
    newer_step,
    read_accelerate_steps_bar,
    read_lightning,
    read_step,
    read_transformers_trainer,
    transformers_logged,
)
from fstrain.core.report.numbers import as_document
from fstrain.core.report.series import rank_series
from tests.unit.test_calibrate_run import finished_run

FIXTURES = Path(__file__).parent.parent / "fixtures" / "trainer-output"
HF = "transformers Trainer"
LIGHTNING = "Lightning Trainer"
ACCELERATE = "Accelerate steps bar"


def lines(name: str) -> list[str]:
    """The file's lines as a relay splits them: at "\\n" only, tqdm's "\\r" redraws kept."""
    return (FIXTURES / name).read_bytes().decode("utf-8").split("\n")


def significant(value: float, digits: int) -> float:
    return float(f"{value:.{digits}g}")


def test_the_formats_are_named_by_their_trainer() -> None:
    assert [name for name, _ in TRAINER_FORMATS][:3] == [HF, LIGHTNING, ACCELERATE]


def test_transformers_log_dicts_in_one_stream_give_the_steps_and_losses_the_trainer_logged() -> None:
    logged = [entry for entry in json.loads((FIXTURES / "transformers-trainer-1proc-merged.trainer_state.json")
                                            .read_text())["log_history"] if "loss" in entry]
    readings = [r for r in map(read_step, lines("transformers-trainer-1proc-merged.txt"))
                if r is not None and r.metrics.loss is not None]
    assert {r.source for r in readings} == {HF}
    # ProgressCallback prints each float as f"{v:.4g}" (transformers 5.25 trainer_callback.py:686)
    assert [(r.metrics.step, r.metrics.steps, r.metrics.loss, r.metrics.lr, r.metrics.extra["grad_norm"])
            for r in readings] == [(e["step"], 12, significant(e["loss"], 4), significant(e["learning_rate"], 4),
                                    significant(e["grad_norm"], 4)) for e in logged]
    assert [e["step"] for e in logged] == [2, 4, 6, 8, 10, 12]


def test_transformers_bar_lines_give_the_step_and_the_final_step_alone() -> None:
    # torchrun --redirects 3: the bar in stderr.log (lines end only where the evaluation bar
    # draws below it, and at the end), the log dicts in stdout.log with no step.
    found = [read_step(line) for line in lines("transformers-trainer-torchrun-rank0-stderr.txt")]
    readings = [r for r in found if r is not None]
    assert readings and {r.source for r in readings} == {HF}
    assert {(r.metrics.step, r.metrics.steps) for r in readings} == {(6, 12), (12, 12)}
    assert all(r.metrics.loss is None for r in readings)
    assert readings[-1].metrics.step == 12


def test_transformers_dicts_in_a_file_of_their_own_add_to_the_step_the_bar_drew() -> None:
    """torchrun --redirects 3: each log dict of stdout.log, read after the bar's draw of its step
    (stderr.log, as the watchdog hands over a line still being written), gives that step its
    loss; the bar's next draws carry it until the next dict. A dict with no bar read before it,
    and the evaluation's and the final dicts, add nothing."""
    draws = draws_as_handed_over("transformers-trainer-torchrun-rank0-stderr.txt")
    dicts = [line for line in lines("transformers-trainer-torchrun-rank0-stdout.txt") if "'loss': " in line]
    assert len(dicts) == 6 and sorted(draws) == list(range(1, 13))
    held = None
    for number, logged_line in enumerate(dicts, start=1):  # logging_steps 2: the dicts of steps 2, 4, ...
        held = newer_step(newer_step(held, draws[2 * number]), logged_line)
        logged = transformers_logged(logged_line)
        assert held is not None and logged is not None and held.source == HF
        assert (held.metrics.step, held.metrics.loss, held.metrics.lr) == (2 * number, logged.loss, logged.lr)
        if number < 6:
            carried = newer_step(held, draws[2 * number + 1])
            assert carried is not None and (carried.metrics.step, carried.metrics.loss) == (2 * number + 1, logged.loss)
    assert newer_step(None, dicts[0]) is None
    for line in lines("transformers-trainer-torchrun-rank0-stdout.txt"):
        if "'eval_loss'" in line or "'train_runtime'" in line:
            assert transformers_logged(line) is None and newer_step(held, line) is held


def draws_as_handed_over(name: str) -> dict[int, str]:
    """Per step, the bar's line as the watchdog hands it over once that step's draw is written:
    the line so far, its last 2 KiB (RankLogTailer.DRAW_BYTES)."""
    draws: dict[int, str] = {}
    for line in lines(name):
        written = ""
        for draw in line.split("\r")[1:]:
            written += "\r" + draw
            reading = read_transformers_trainer(written[-2048:])
            if reading is not None:
                draws[reading.step] = written[-2048:]
    return draws


def test_the_examples_dicts_give_each_step_its_loss_and_the_jobs_tokens_per_second() -> None:
    """examples/train_hf.py under torchrun (include_num_input_tokens_seen, a log per step): the
    dict after each step's draw gives that step the loss the Trainer logged for it (its
    trainer_state.json) and the job's tokens/s since the start, which the dict says; the tokens
    seen are the step's, 16 sequences of 64 tokens each."""
    logged = [e for e in json.loads((FIXTURES / "train_hf.trainer_state.json").read_text())["log_history"]
              if "loss" in e]
    draws = draws_as_handed_over("train_hf-torchrun-rank0-stderr.txt")
    dicts = [line for line in lines("train_hf-torchrun-rank0-stdout.txt") if "'loss': " in line]
    assert len(dicts) == len(logged) == 40 and sorted(draws) == list(range(1, 41))
    held = None
    for entry, logged_line in zip(logged, dicts, strict=True):
        held = newer_step(newer_step(held, draws[entry["step"]]), logged_line)
        assert held is not None
        rate = float(logged_line.split("'train_tokens_per_second': '")[1].split("'")[0])
        assert (held.metrics.step, held.metrics.steps, held.metrics.loss, held.metrics.tokens_per_s) == (
            entry["step"], 40, significant(entry["loss"], 4), rate)
        assert held.metrics.extra["num_input_tokens_seen"] == entry["num_input_tokens_seen"] == 16 * 64 * entry["step"]


@pytest.mark.parametrize("name", ["transformers-trainer-torchrun-rank0-stdout.txt",
                                  "transformers-trainer-torchrun-rank1-stdout.txt",
                                  "transformers-trainer-torchrun-rank1-stderr.txt"])
def test_transformers_lines_without_the_bar_say_no_step(name: str) -> None:
    assert [line for line in lines(name) if read_step(line) is not None] == []


def test_transformers_evaluation_and_final_dicts_carry_no_training_loss() -> None:
    for line in lines("transformers-trainer-1proc-merged.txt"):
        if "'eval_loss'" in line or "'train_runtime'" in line:
            reading = read_transformers_trainer(line)
            assert reading is None or reading.loss is None


def test_lightning_bar_gives_the_batches_done_and_the_loss_its_csv_logger_logged() -> None:
    with (FIXTURES / "lightning-torchrun.metrics.csv").open() as handle:
        logged = {int(row["step"]): float(row["train_loss"]) for row in csv.DictReader(handle) if row["train_loss"]}
    readings = [r for r in map(read_step, lines("lightning-torchrun-rank0-stdout.txt")) if r is not None]
    assert readings and {r.source for r in readings} == {LIGHTNING}
    for reading in readings:  # the CSV's step counts from 0, the bar's batches done from 1
        assert reading.metrics.loss == significant(logged[reading.metrics.step - 1], 3)
    assert readings[-1].metrics.step == max(logged) + 1 == 12
    assert [line for line in lines("lightning-torchrun-rank0-stderr.txt") if read_step(line) is not None] == []


BUNDLED_PROGRESS = ("[localhost r0] [fstrain.train] step 2/3 loss 6.2902 lr 3.000e-04 tokens/s 299 "
                    "max_rss_bytes=360.1MiB")
FSTRAIN_METRIC = '[localhost r0] FSTRAIN_METRICS {"v":1,"step":2,"steps":3,"loss":6.29}'
NOT_A_STEP = [
    BUNDLED_PROGRESS,
    FSTRAIN_METRIC,
    "[2026-11-30 15:10:49,100] [INFO] [logging.py:107:log_dist] [Rank 0] step=10, skipped=0, lr=[0.0003], "
    "mom=[(0.9, 0.95)]",
    '  File "/usr/lib/python3.11/site-packages/transformers/trainer.py", line 2311, in _maybe_log_save_evaluate',
    "Traceback (most recent call last):",
    "{'loss': '4.035', 'grad_norm': '0.7301', 'learning_rate': '0.0005', 'epoch': '0.0625'}",  # no step
    "\rMap: 100%|##########| 512/512 [00:00<00:00, 9120.33 examples/s]",  # datasets' map: a description
    "\rValidation DataLoader 0: 100%|##########| 2/2 [00:00<00:00, 176.92it/s]\x1b[A",
    "\r 50%|#####     | 1/2 [00:00<00:00, 169.44it/s]\x1b[A",  # an evaluation bar drawn below the training bar
    "",
]


@pytest.mark.parametrize("line", NOT_A_STEP)
@pytest.mark.parametrize("read", [read_transformers_trainer, read_lightning, read_accelerate_steps_bar],
                         ids=[HF, LIGHTNING, ACCELERATE])
def test_other_lines_are_no_trainer_step(read: object, line: str) -> None:
    assert callable(read) and read(line) is None


def test_a_line_longer_than_a_relay_keeps_is_not_read() -> None:
    # The watchdog keeps a line's first MAX_LINE_BYTES: its last draws, the latest, would be gone.
    draws = "".join(f"\r{100 * step // 4000:3d}%|#   | {step}/4000 [00:01<00:10,  8.50it/s]" for step in range(1, 2000))
    assert len(draws) > MAX_LINE_BYTES and read_transformers_trainer(draws) is None
    assert read_transformers_trainer(draws[-200:]) is not None
    assert read_lightning("Epoch 0:" + draws.replace("\r", "\rEpoch 0:")) is None


def test_each_reader_leaves_the_other_trainers_lines_alone() -> None:
    assert all(read_lightning(line) is None for line in lines("transformers-trainer-1proc-merged.txt"))
    assert all(read_transformers_trainer(line) is None for line in lines("lightning-torchrun-rank0-stdout.txt"))
    others = lines("transformers-trainer-1proc-merged.txt") + lines("lightning-torchrun-rank0-stdout.txt")
    assert all(read_accelerate_steps_bar(line) is None for line in others)
    accelerate = lines("accelerate-steps-bar-stderr.txt")
    assert all(read(line) is None for line in accelerate for read in (read_transformers_trainer, read_lightning))


def test_an_accelerate_scripts_steps_bar_gives_the_step_loss_and_rate_it_logged() -> None:
    logged = {int(step): values for step, values in
              json.loads((FIXTURES / "accelerate-steps-bar.tensorboard.json").read_text()).items()}
    found = [r for r in map(read_step, lines("accelerate-steps-bar-stderr.txt")) if r is not None]
    assert found and {r.source for r in found} == {ACCELERATE}
    last = found[-1].metrics  # the bar's one line ends at the end of the run: its last draw
    assert (last.step, last.steps) == (8, 8)
    # tqdm shows 3 significant digits (its format_num); TensorBoard keeps float32
    assert last.loss == pytest.approx(logged[8]["step_loss"], rel=5e-3)
    assert last.lr == pytest.approx(logged[8]["lr"], rel=5e-3)
    # Draw by draw, as a relay that passes the redraws as they come gives them: each step's last
    # draw shows what the loop logged at that step.
    by_step = {}
    for draw in "".join(lines("accelerate-steps-bar-stderr.txt")).split("\r"):
        reading = read_accelerate_steps_bar(draw)
        if reading is not None:
            by_step[reading.step] = reading
    assert set(by_step) - {0} == set(logged)
    for step, values in logged.items():
        assert by_step[step].loss == pytest.approx(values["step_loss"], rel=5e-3), step
        assert by_step[step].lr == pytest.approx(values["lr"], rel=5e-3), step


def test_a_metric_line_and_the_bundled_progress_line_read_as_before() -> None:
    reading = read_step(FSTRAIN_METRIC)
    assert reading is not None and reading.source == METRIC_LINE
    reading = read_step(BUNDLED_PROGRESS)
    assert reading is not None and reading.source == PROGRESS_LINE and reading.metrics.step == 2


def test_report_keeps_a_logged_loss_when_the_bar_says_its_step_again() -> None:
    # After an evaluation, and at the end, the Trainer redraws its bar at the step it just logged.
    logged = {e["step"]: significant(e["loss"], 4) for e in json.loads(
        (FIXTURES / "transformers-trainer-1proc-merged.trainer_state.json").read_text())["log_history"] if "loss" in e}
    (series,) = rank_series(lines("transformers-trainer-1proc-merged.txt"))
    assert {p.step: p.loss for p in series.points if p.loss is not None} == logged
    assert [p.step for p in series.points] == list(range(1, 13))  # each step the bar drew


def test_report_has_every_step_the_bar_drew_in_a_file_of_its_own() -> None:
    (series,) = rank_series(f"[node1 r0] {line}" for line in lines("transformers-trainer-torchrun-rank0-stderr.txt"))
    assert (series.rank, series.host) == (0, "node1")
    assert [(p.step, p.loss) for p in series.points] == [(step, None) for step in range(1, 13)]
    (series,) = rank_series(lines("train_hf-torchrun-rank0-stderr.txt"))  # its saves end the bar's lines
    assert [p.step for p in series.points] == list(range(1, 41))


def test_the_report_reads_a_bars_lines_from_the_logs_whole(tmp_path: Path) -> None:
    """`fstrain report` reads the run's logs (here a launcher's log file) line by line: a bar's
    line stays one line ("\\r" splits none) and is kept for the series with its every step."""
    from fstrain.api.report import numbered_lines
    from fstrain.io.logs import FileOutputs

    log = tmp_path / "node1.log"
    raw = (FIXTURES / "train_hf-torchrun-rank0-stderr.txt").read_bytes()
    log.write_bytes(b"".join(b"[node1 r0] " + line + b"\n" for line in raw.split(b"\n")[:-1]))
    resumes: list[str] = []
    (series,) = rank_series(numbered_lines(FileOutputs(lambda: [log], None), resumes))
    assert (series.rank, series.host, [p.step for p in series.points]) == (0, "node1", list(range(1, 41)))
    assert resumes == []


def test_the_report_of_a_run_directory_reads_the_trainers_own_lines(tmp_path: Path) -> None:
    # `fstrain report RUN_DIR` (and `plan --calibrate RUN_DIR`) read the node logs line by line,
    # each line whole: the Trainer's log dicts end lines of its bar's "\r" redraws.
    run_dir = finished_run(tmp_path / "run", "".join(
        f"[node1 r0] {line}\n" for line in lines("transformers-trainer-1proc-merged.txt") if line), nproc=1)
    logged = {e["step"]: significant(e["loss"], 4) for e in json.loads(
        (FIXTURES / "transformers-trainer-1proc-merged.trainer_state.json").read_text())["log_history"] if "loss" in e}
    document = as_document(report(str(run_dir)))
    [rank] = document["ranks"]
    assert (rank["rank"], rank["host"], rank["read_from"], document["world_size"]) == (0, "node1", HF, 1)
    assert {p["step"]: p["loss"] for p in rank["points"] if p["loss"] is not None} == logged


@pytest.mark.parametrize(("name", "state"), [("train_hf-torchrun-rank0", "train_hf.trainer_state.json"),
                                             ("transformers-trainer-torchrun-rank0", None)])
def test_the_report_gives_each_lone_dict_the_step_its_bar_was_cleared_at(tmp_path: Path, name: str,
                                                                          state: str | None) -> None:
    """Under torchrun (stdout and stderr in files of their own) the rank's log holds the
    Trainer's log dicts as lines of their own, before its bar's line ends: each dict goes to the
    step the bar was cleared at for it, so the report has the losses the Trainer logged, at
    their steps (its trainer_state.json), and the job's tokens/s where the dict says it."""
    stdout = [line for line in lines(f"{name}-stdout.txt") if line]
    stderr = [line for line in lines(f"{name}-stderr.txt") if line]
    run_dir = finished_run(tmp_path / "run", "".join(f"[node1 r0] {line}\n" for line in stdout + stderr), nproc=1)
    [rank] = as_document(report(str(run_dir)))["ranks"]
    losses = {p["step"]: p["loss"] for p in rank["points"] if p["loss"] is not None}
    dicts = [line for line in stdout if "'loss': " in line]
    if state is None:  # its evaluation's dicts (no training loss) are not placed
        assert sorted(losses) == [2, 4, 6, 8, 10, 12]
        assert list(losses.values()) == [float(d.split("'loss': '")[1].split("'")[0]) for d in dicts]
        return
    logged = [e for e in json.loads((FIXTURES / state).read_text())["log_history"] if "loss" in e]
    assert losses == {e["step"]: significant(e["loss"], 4) for e in logged}
    rates = [float(d.split("'train_tokens_per_second': '")[1].split("'")[0]) for d in dicts]
    assert [p["tokens_per_s"] for p in rank["points"]] == rates and rank["tokens_scope"] == "job"
    # A dict more than the bar's clears (a first attempt's bar lost): none is placed, none misplaced.
    (series,) = rank_series([f"[node1 r0] {dicts[0]}", *(f"[node1 r0] {line}" for line in stdout + stderr)])
    assert all(p.loss is None for p in series.points)


def test_a_detached_resumed_trainer_run_has_every_steps_loss_in_its_report() -> None:
    """Node 0's output file of a detached HF Trainer run that lost a host and resumed from
    checkpoint-70: the bar's lines are cut by the checkpoint saves' own bar, and its redraws
    after a dict run ahead of its throttled draws; every step 1-200 still gets the loss logged
    for it, the steps done again after the resume (71-78) the second attempt's."""
    from fstrain.core.monitor.logtail import node_line

    tagged = []
    for raw in (FIXTURES / "train_hf-detached-node0.out").read_bytes().decode("utf-8").split("\n"):
        _, rank, text = node_line(raw, 0)
        tagged.append(f"[node1 r{rank}] {text}" if rank is not None else f"[node1] {text}")
    dicts = [float(line.split("'loss': '")[1].split("'")[0]) for line in tagged if "{'loss': " in line]
    assert len(dicts) == 78 + 130  # steps 1-78, then 71-200 after the resume
    (series,) = rank_series(tagged)
    losses = {p.step: p.loss for p in series.points if p.loss is not None}
    assert sorted(losses) == list(range(1, 201))
    assert [losses[step] for step in range(1, 71)] == dicts[:70]
    assert [losses[step] for step in range(71, 201)] == dicts[78:]
