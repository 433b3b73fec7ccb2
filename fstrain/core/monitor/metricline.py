"""The metric line: one line a rank prints to report a training step's numbers.

Any program fstrain launches can report its steps by printing, on stdout or stderr, a line
that starts with ``FSTRAIN_METRICS `` followed by one JSON object on the same line::

    FSTRAIN_METRICS {"v": 1, "step": 120, "loss": 2.314, "tokens_per_s": 51234.5, "step_s": 0.81}

Only ``step`` (an integer >= 0) is required; every other field is optional and may be null.
Nothing from fstrain needs to be installed on the nodes to print it. The bundled trainer prints
it on every rank for every logged step (fstrain.train). The watchdog, ``status``, the
Prometheus textfile and ``fstrain report`` read it from the ranks' output.

Fields (units in the names): ``v`` the format version (absent: 1), ``step``, ``steps`` (the
final step), ``loss``, ``lr``, ``tokens_per_s`` (this rank's share of the step's tokens per
second or the whole job's, as ``scope`` says: "rank" or "job"), ``step_s`` (wall seconds of the
step), ``memory_bytes`` (peak bytes the rank's accelerator allocator reserved), ``rank``,
``time`` (Unix seconds when the step ended). Unknown fields are kept in ``extra``.

A rank that prints no metric line may still say its step in the bundled trainer's progress line
(fstrain/train/loop.py), ``[fstrain.train] step 5/20 loss 3.1234 lr ... tokens/s 12,345 ...``,
or in a trainer's own output, as it prints it (:data:`TRAINER_FORMATS`; read from rank 0, the
only rank these print on):

- transformers' ``Trainer`` (5.25: trainer_callback.py:643-690, ProgressCallback; trainer.py:4233
  ``Trainer.log``): a tqdm bar ``tqdm(total=max_steps)`` on stderr, `` 33%|###  | 4/12 [00:08<00:17,
  2.16s/it]``, which gives ``step`` and ``steps``; and per logging step the log dict on stdout,
  ``{'loss': '4.222', 'grad_norm': '1.291', 'learning_rate': '0.0009', 'epoch': '0.0625'}``
  (floats as ``f"{v:.4g}"`` strings; 4.x printed them bare), which has no step: it is read
  (``loss``, ``lr``, ``grad_norm`` in ``extra``; with ``include_num_input_tokens_seen``, its
  ``train_tokens_per_second`` as the job's ``tokens_per_s``, averaged since the Trainer's start,
  and ``num_input_tokens_seen`` in ``extra``) where it ends a line that holds the bar (stdout
  and stderr in one stream), the bar's last draw before it giving its step. That draw is the
  dict's own step where steps take longer than tqdm's 0.1 s between draws. Where the two
  streams are files of their own (torchrun's ``--redirects 3``, how fstrain starts ranks), the
  dict alone adds its numbers to the rank's latest step (:func:`newer_step`), and the bar's
  later draws carry them until the next dict. The ``trainer_state.json`` beside a checkpoint
  has each logged step, but only from a checkpoint on and in the program's own output folder:
  it is no line of output, and not read.
- PyTorch Lightning's ``Trainer`` (2.6: callbacks/progress/tqdm_progress.py, TQDMProgressBar, its
  default where rich is not installed; trainer/connectors/callback_connector.py:154): a tqdm bar
  on stdout, ``Epoch 1:  17%|#  | 1/6 [00:00<00:00, 118.05it/s, v_num=0, train_loss=2.840]``,
  read as ``step`` = the batches done since the run began and the ``loss``/``train_loss``
  shown. Its rich bar (RichProgressBar, the default where rich is installed) draws nothing on a
  pipe or a file until the run ends, and is not read.
- a script on Hugging Face Accelerate (which prints no step itself: ``Accelerator.log`` goes to
  trackers' files) that draws diffusers' training examples' step bar on rank 0, ``tqdm(range(0,
  max_train_steps), initial=global_step, desc="Steps")`` with ``set_postfix(step_loss=...,
  lr=...)``: ``Steps:  40%|####  | 4/10 [00:01<00:01,  3.05it/s, lr=0.0001, step_loss=0.123]``
  gives ``step``, ``steps``, ``loss`` and ``lr``; transformers' ``*_no_trainer.py`` examples draw
  a bare ``tqdm(range(max_train_steps))``, read as the Trainer's bar (step and final step);
- DeepSpeed's engine (deepspeed/runtime/engine.py ``_report_progress``, every ``steps_per_print``
  steps, rank 0, an INFO line: ``"log_level": "info"`` in the config where the logger is at
  WARNING), ``[Rank 0] step=10, skipped=0, lr=[0.001], mom=[(0.9, 0.999)]``: the step, the first
  parameter group's learning rate, the rank; the skipped steps in ``extra``;
- DeepSpeed's ThroughputTimer (deepspeed/utils/timer.py ``ThroughputTimer.stop``, same steps),
  ``epoch=0/micro_step=20/global_step=10, RunningAvgSamplesPerSec=..., CurrSamplesPerSec=...,
  MemAllocated=0.1GB, MaxMemAllocated=0.1GB``: the step (``global_step``); its rates count
  samples of the whole job, not tokens (tokens/s would need the sequence length, which the line
  does not carry), so ``tokens_per_s`` stays None and ``extra`` keeps ``samples_per_s``
  (CurrSamplesPerSec), ``avg_samples_per_s`` and ``max_memory_allocated_bytes`` (the allocator's
  allocated peak, not the reserved one ``memory_bytes`` means);
- torchtitan (torchtitan/components/metrics.py ``MetricsProcessor.log``), colour codes and all,
  ``step: 10  loss:  7.9  grad_norm: 1.2  memory: 9.46GiB(64.99%)  tps: 7,282  tflops: 0.52
  mfu: 0.17%``: step, loss, ``tps`` as this rank's tokens/s (scope "rank": torchtitan divides by
  the non-data-parallel size), the reserved peak as ``memory_bytes``; grad_norm, tflops, mfu in
  ``extra``; its ``validate step:`` line is not a training step;
- Megatron-LM and NeMo's Megatron-Bridge (megatron/training/training.py ``training_log``), ``iteration
  10/ 100 | consumed samples: ... | elapsed time per iteration (ms): 812.3 | learning rate:
  1.5E-04 | global batch size: 128 | lm loss: 7.9E+00 | ...``: step, final step, ``lm loss``,
  learning rate, step time; consumed samples, global batch size, grad norm, loss scale, TFLOP/s
  per GPU and the skipped and NaN iterations in ``extra``; no tokens/s (samples again).

tqdm redraws a bar with "\r", not "\n": a line of such output holds many draws, and ends only
where the trainer prints a line of its own or another bar draws below it (an evaluation). A
"\r" ends a draw, not a line: the relays and logs move whole lines, as written, and the node's
watchdog, which alone sees a rank's bytes as they are written, hands the draws of a line still
being written to the step readers as they come (fstrain/io/remote/watchdog.py, RankLogTailer),
read here as a line that holds them.
:func:`read_step` is the one reader of a rank's step from a line of its output, whichever of
these it is: the watchdog's Prometheus textfile, ``status`` and its live view, ``fstrain report``,
the launch's progress and the recovery loop all read through it. :func:`newer_reading` keeps a
rank's latest numbers across its lines (a metric line, once printed, wins over the others), for
``status`` (:func:`newer_step`) and the Prometheus textfile alike.

Pure and stdlib only: the node-side watchdog sends this module with itself.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

PREFIX = "FSTRAIN_METRICS "
METRIC_LINE_VERSION = 1
SCOPES = ("rank", "job")
_FLOATS = ("loss", "lr", "tokens_per_s", "step_s", "time")
_INTS = ("steps", "memory_bytes", "rank")
_KNOWN = frozenset(("v", "step", "scope", *_FLOATS, *_INTS))
MAX_LINE_BYTES = 64 * 1024  # a longer line is not a metric line
# The bundled trainer's progress line: its mark, and its numbers (what follows "step N/M" is optional).
PROGRESS_MARK = "[fstrain.train] step "
_PROGRESS_RE = re.compile(r"\bstep (\d+)(?:/(\d+))?(?:.*?\bloss ([0-9.eE+-]+|nan|inf))?(?:.*?\btokens/s ([0-9,.]+))?")
METRIC_LINE = "metric line"
PROGRESS_LINE = "progress line"


@dataclass(frozen=True)
class StepMetrics:
    """One step's numbers as one rank reported them; None where the line left a field out."""

    step: int
    steps: int | None = None
    loss: float | None = None
    lr: float | None = None
    tokens_per_s: float | None = None
    scope: str = "job"
    step_s: float | None = None
    memory_bytes: int | None = None
    rank: int | None = None
    time: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The line's JSON object: the version, then every field that is set."""
        out: dict[str, Any] = {"v": METRIC_LINE_VERSION, "step": self.step}
        for name in ("steps", "loss", "lr", "tokens_per_s", "step_s", "memory_bytes", "rank", "time"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.tokens_per_s is not None:
            out["scope"] = self.scope
        out.update({k: v for k, v in self.extra.items() if k not in _KNOWN})
        return out


def format_metric_line(metrics: StepMetrics) -> str:
    """The line (without its newline): the prefix and compact JSON (non-finite numbers as null)."""
    body = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.as_dict().items()}
    return PREFIX + json.dumps(body, separators=(",", ":"), allow_nan=False)


def parse_metric_line(line: str | bytes) -> StepMetrics | None:
    """The step's numbers from one output line; None when the line is not a metric line, or is
    one this fstrain cannot read (bad JSON, no integer step, a newer version, a wrong type).
    Text before the prefix (a launcher's "[rank 3]: " tag) is allowed."""
    if isinstance(line, bytes):
        if len(line) > MAX_LINE_BYTES:
            return None
        line = line.decode("utf-8", "replace")
    elif len(line) > MAX_LINE_BYTES:
        return None
    at = line.find(PREFIX)
    if at < 0:
        return None
    try:
        body = json.loads(line[at + len(PREFIX):].strip())
    except ValueError:
        return None
    return from_mapping(body)


def from_mapping(body: Any) -> StepMetrics | None:
    """A metric line's object (also one line of a metrics.jsonl file) as values; None when unreadable."""
    if not isinstance(body, Mapping):
        return None
    version = body.get("v", 1)
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= METRIC_LINE_VERSION:
        return None
    step = body.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return None
    values: dict[str, Any] = {}
    for name in _FLOATS:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        values[name] = float(value)
    for name in _INTS:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            return None
        values[name] = value
    scope = body.get("scope", "job")
    if scope not in SCOPES:
        return None
    extra = {k: v for k, v in body.items() if k not in _KNOWN}
    return StepMetrics(step=step, scope=scope, extra=extra, **values)


def parse_metrics_jsonl(text: str) -> list[StepMetrics]:
    """The steps a metrics.jsonl holds (``RUN_DIR/metrics/rank<R>.jsonl``), in file order; a line
    that is not a readable object (a run killed while writing its last line) is left out."""
    found = []
    for line in text.splitlines():
        try:
            metrics = from_mapping(json.loads(line))
        except ValueError:
            continue
        if metrics is not None:
            found.append(metrics)
    return found


@dataclass(frozen=True)
class StepReading:
    """What one output line says of a rank's step: its numbers (a progress line gives ``step``,
    ``steps``, ``loss`` and ``tokens_per_s`` at most) and the form that said them."""

    metrics: StepMetrics
    source: str
    """``metric line``, ``progress line``, or a trainer format's name (the first of its pair in
    :data:`TRAINER_FORMATS`, e.g. ``DeepSpeed engine``)."""

    @property
    def from_metric_line(self) -> bool:
        """A metric line carries more than a progress line: where a rank prints both, it wins."""
        return self.source == METRIC_LINE


def read_step(line: str, any_program: bool = False) -> StepReading | None:
    """A rank's step from one line of its output: the metric line where the line holds one, else
    a trainer's own step line (:data:`TRAINER_FORMATS`), else the progress line
    (:func:`read_progress`, ``any_program`` as there); None for any other line. Text before any
    of them (a host, rank or launcher tag) is allowed."""
    metrics = parse_metric_line(line)
    if metrics is not None:
        return StepReading(metrics, METRIC_LINE)
    for name, read in TRAINER_FORMATS:
        metrics = read(line)
        if metrics is not None:
            return StepReading(metrics, name)
    progress = read_progress(line, any_program)
    return StepReading(progress, PROGRESS_LINE) if progress is not None else None


def newer_step(held: StepReading | None, line: str, any_program: bool = True) -> StepReading | None:
    """A rank's latest numbers once one more line of its output is read, ``held`` being those
    of its lines before: :func:`newer_reading` of the line's reading (:func:`read_step`, any
    program's ``step N`` included unless ``any_program`` is False). Folded over a rank's lines
    in the order written, it gives what ``status``, its live view and the detached nodes'
    per-rank records show."""
    return newer_reading(held, read_step(line, any_program), line)


def newer_reading(held: StepReading | None, reading: StepReading | None, line: str) -> StepReading | None:
    """The one rule that keeps a rank's latest numbers, ``held`` those before and ``reading``
    what its next line, ``line``, says (None: no step): the line's, unless it is not a metric
    line and the rank has printed one (which carries more: step time, memory); else ``held``.
    Two lines of the same step that are not metric lines add up (:func:`same_step`): DeepSpeed
    prints the step's learning rate on one line and its samples/s on the next. A transformers
    Trainer's log dict alone (:func:`transformers_logged`) adds its numbers to a held Trainer
    step, and the Trainer's later bar draws keep them until its next log. The Prometheus
    textfile (promfile.py) folds its lines through it too."""
    if reading is None:
        logged = transformers_logged(line) if held is not None and held.source == TRANSFORMERS else None
        return held if logged is None or held is None else StepReading(with_logged(held.metrics, logged), TRANSFORMERS)
    if held is not None and held.from_metric_line and not reading.from_metric_line:
        return held
    if held is not None and reading.source == held.source == TRANSFORMERS:
        # The Trainer logs every logging_steps; its bar's draws between carry the latest log.
        carried = replace(filled(reading.metrics, held.metrics), extra={**held.metrics.extra, **reading.metrics.extra})
        return StepReading(carried, TRANSFORMERS)
    if held is not None and not reading.from_metric_line:
        return StepReading(same_step(held.metrics, reading.metrics), reading.source)
    return reading


def same_step(held: StepMetrics, later: StepMetrics) -> StepMetrics:
    """``later``, with what ``held`` said and ``later`` leaves out where both are of one step (the
    scope goes with the tokens/s it describes); ``later`` alone for another step."""
    if held.step != later.step:
        return later
    scope = later.scope if later.tokens_per_s is not None else held.scope
    return replace(filled(later, held), scope=scope, extra={**held.extra, **later.extra})


_Record = TypeVar("_Record")


def filled(later: _Record, held: _Record) -> _Record:
    """``later`` (a dataclass), each of its fields that is None taken from ``held``: two reports
    of one step, the later one leaving out what the earlier said."""
    return replace(later, **{f.name: getattr(held, f.name) for f in fields(later)  # type: ignore[arg-type,type-var]
                             if getattr(later, f.name) is None})


def read_progress(line: str, any_program: bool = False) -> StepMetrics | None:
    """Step, final step, loss and tokens/s from a progress line: the bundled trainer's, read from
    its ``[fstrain.train] step`` on; with ``any_program``, also any line that says ``step N``
    (a program's own ``rank 3 step 4/10 loss 2.5``, which ``status`` and the recovery loop
    read). A number that does not read as one is left out (None)."""
    if any_program:
        at = 0 if "step " in line else -1
    else:
        at = line.find(PROGRESS_MARK)
        at = at + len(PROGRESS_MARK) - len("step ") if at >= 0 else -1
    match = _PROGRESS_RE.search(line, at) if at >= 0 else None
    if match is None:
        return None
    step, total, loss, rate = match.groups()
    return StepMetrics(step=int(step), steps=int(total) if total else None, loss=_float(loss),
                       tokens_per_s=_float(rate.replace(",", "")) if rate else None)


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:  # "loss -" or "tokens/s ." in a line that only looks like a progress line
        return None


# Trainers' own output, read as it is (docs/observability.md, "Trainers' own output"). Both
# trainers below draw a tqdm bar: on a pipe or in a file (a rank's log), tqdm redraws it by
# writing "\r" and the bar again, never "\n", so one line of the rank's output holds many draws
# of it; its last draw is the latest. A bar drawn below another (tqdm's position 1 and on:
# an evaluation bar) ends with the cursor-up escape "\x1b[A" and is not read.
# tqdm's default bar_format, and Lightning's (the same fields): "{desc}: {percentage:3.0f}%|{bar}|
# {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"; groups: desc, n, total, bracket.
_TQDM_BAR_RE = re.compile(r"(.*?) *\d{1,3}%\|[^|]*\| *(\d+)/(\d+|\?) \[([^\]]*)\]")
# transformers' Trainer log dict (ProgressCallback.on_log, PrinterCallback.on_log): its keys and
# values, 4.x printing floats as they are, 5.x as quoted strings ("'loss': '4.223'").
_HF_FIELD_RE = re.compile(r"'(loss|learning_rate|grad_norm|train_tokens_per_second|num_input_tokens_seen)': "
                          r"'?([-+0-9.eE]+|nan|inf|-inf)'?")
TRANSFORMERS = "transformers Trainer"  # the source of its readings (TRAINER_FORMATS)
# The names a Lightning module most often gives its training loss in self.log(..., prog_bar=True).
LIGHTNING_LOSS_NAMES = ("loss", "train_loss", "train/loss")
# Accelerate itself prints no step (accelerate 1.16.0: Accelerator.log, accelerator.py:3302-3332,
# hands the values to trackers, tracking.py, which write their own files and log at DEBUG); the
# scripts built on it draw a step bar: diffusers' examples as "Steps", with the step's loss as
# step_loss or loss (examples/text_to_image/train_text_to_image.py:955-961,1092-1093 at 58eb52c0).
ACCELERATE_LOSS_NAMES = ("step_loss", "loss", "train_loss")


def _tqdm_draws(line: str) -> list[re.Match[str]]:
    """The tqdm bars drawn at the top position in ``line``, in the order drawn."""
    draws = []
    for part in line.split("\r"):
        match = _TQDM_BAR_RE.fullmatch(part.strip(" \n"))
        if match is not None:
            draws.append(match)
    return draws


def read_transformers_trainer(line: str) -> StepMetrics | None:
    """A step of Hugging Face transformers' ``Trainer`` from one line of rank 0's output: its
    training bar (ProgressCallback: ``tqdm(total=max_steps)``, no description, on stderr), the
    last draw in the line giving ``step``/``steps``; where the line ends with the Trainer's log
    dict after the bar (stdout and stderr in one stream), also that dict's numbers
    (:func:`transformers_logged`). The dict alone (stdout in a file of its own) says no step and
    reads as None (:func:`newer_step` adds it to the rank's step), as does the evaluation's dict
    and the final ``train_runtime`` one, and a line over MAX_LINE_BYTES (a reader that cut it
    kept its oldest draws)."""
    if "%|" not in line or len(line) > MAX_LINE_BYTES:
        return None
    cut = line.rfind("\r")
    logged = transformers_logged(line[cut + 1:]) if cut >= 0 else None
    draws = [m for m in _tqdm_draws(line[:cut] if logged is not None else line) if not m.group(1)]
    if not draws or draws[-1].group(3) == "?":
        return None
    found = StepMetrics(step=int(draws[-1].group(2)), steps=int(draws[-1].group(3)))
    return found if logged is None else with_logged(found, logged)


def transformers_steps(line: str) -> list[StepMetrics]:
    """Every step a transformers ``Trainer`` bar line drew, in step order, each once: a line of
    its output holds the draws of many steps (:func:`read_transformers_trainer` reads its last);
    the last with the log dict that ends the line, where one does. [] for any other line."""
    last = read_transformers_trainer(line)
    if last is None:
        return []
    drawn = {int(m.group(2)): StepMetrics(step=int(m.group(2)), steps=int(m.group(3)))
             for m in _tqdm_draws(line) if not m.group(1) and m.group(3) != "?"}
    drawn[last.step] = last
    return [drawn[step] for step in sorted(drawn)]


def transformers_written_steps(line: str) -> list[StepMetrics]:
    """The steps at which a transformers ``Trainer`` bar line was cleared for a line printed on
    another stream, in order: each log dict goes out through ``training_bar.write``
    (ProgressCallback.on_log), and tqdm's ``write`` clears the bar (a carriage return and blanks),
    returns once more, prints the dict, then draws the bar again at the step it has reached, the
    one the dict was logged at (tqdm/std.py ``external_write_mode``; the draw before the clear
    may be older: tqdm draws at most every 0.1 s). In a file of its own (torchrun's
    ``--redirects 3``) the log dicts come in this order on the other stream, one per clear
    (``rank_series`` pairs them). Only the bar alone drawn so counts: a write while the
    evaluation's bar is open below it clears both, across lines, and is not one of these (nor
    is its dict a training step's)."""
    if "%|" not in line or len(line) > MAX_LINE_BYTES:
        return []
    parts = line.split("\r")
    written = []
    for index in range(len(parts) - 2):
        if parts[index] and not parts[index].strip() and parts[index + 1] == "":
            again = _TQDM_BAR_RE.fullmatch(parts[index + 2].strip(" \n"))
            if again is not None and not again.group(1) and again.group(3) != "?":
                written.append(StepMetrics(step=int(again.group(2)), steps=int(again.group(3))))
    return written


def transformers_bar_written(text: str) -> bool:
    """Whether ``text`` ends with a transformers ``Trainer`` log dict that its bar wrote
    (:func:`transformers_written_steps`): a training step's (``loss``) or the final one
    (``train_runtime``), each with the ``epoch`` the Trainer adds to every dict; not the
    evaluation's (``eval_*``), written while the evaluation's own bar is open."""
    at = text.find("{'")
    return (at >= 0 and len(text) <= MAX_LINE_BYTES and text.rstrip().endswith("}") and "'epoch': " in text
            and "'eval_" not in text)


def transformers_logged(text: str) -> StepMetrics | None:
    """The numbers of a transformers ``Trainer`` log dict of a training step (one with a
    ``loss``, after a rank tag or tqdm's cursor-up escapes where a bar drew below): ``loss``, ``lr``
    (``learning_rate``), ``tokens_per_s`` (``train_tokens_per_second``, the job's since the
    Trainer's start, logged with ``include_num_input_tokens_seen``), ``grad_norm`` and
    ``num_input_tokens_seen`` in ``extra``; the step is 0, the dict does not say it (see
    :func:`with_logged`). None for any other text, the evaluation's and the final dict
    included."""
    at = text.find("{'")
    if at < 0 or "'loss': " not in text or len(text) > MAX_LINE_BYTES or not text.rstrip().endswith("}"):
        return None
    text = text[at:]
    fields = {name: _float(value) for name, value in _HF_FIELD_RE.findall(text)}
    extra = {name: fields[name] for name in ("grad_norm", "num_input_tokens_seen") if fields.get(name) is not None}
    seen = extra.get("num_input_tokens_seen")
    if seen is not None and seen.is_integer():
        extra["num_input_tokens_seen"] = int(seen)
    return StepMetrics(step=0, loss=fields.get("loss"), lr=fields.get("learning_rate"),
                       tokens_per_s=fields.get("train_tokens_per_second"), extra=extra)


def with_logged(step: StepMetrics, logged: StepMetrics) -> StepMetrics:
    """``step`` (a bar's draw) with a Trainer log dict's numbers (:func:`transformers_logged`)."""
    return replace(step, loss=logged.loss, lr=logged.lr, tokens_per_s=logged.tokens_per_s, scope="job",
                   extra={**step.extra, **logged.extra})


def read_lightning(line: str) -> StepMetrics | None:
    """A step of PyTorch Lightning's ``Trainer`` from one line of rank 0's output: the last
    draw of its training bar (TQDMProgressBar, ``Epoch E:`` and the batches done of the
    epoch's ``n/total``, the ``self.log(..., prog_bar=True)`` metrics after the rate). The
    step is the batches done since the run began, ``E * total + n``: the optimizer steps where
    each batch is one (no gradient accumulation). The loss is the bar's ``loss``,
    ``train_loss`` or ``train/loss`` (3 significant digits, as tqdm formats it). None for a
    bar whose epoch has no known length past epoch 0, for a line over MAX_LINE_BYTES, and for
    any other line."""
    if "Epoch " not in line or "%|" not in line or len(line) > MAX_LINE_BYTES:
        return None
    for match in reversed(_tqdm_draws(line)):
        desc, n, total, bracket = match.groups()
        if not desc.startswith("Epoch ") or not desc.endswith(":") or not desc[6:-1].isdigit():
            continue
        epoch = int(desc[6:-1])
        if total == "?" and epoch > 0:
            return None
        step = int(n) + (epoch * int(total) if total != "?" else 0)
        shown = _postfix(bracket)
        loss = next((_float(shown[name]) for name in LIGHTNING_LOSS_NAMES if name in shown), None)
        return StepMetrics(step=step, loss=loss, lr=_float(shown.get("lr")))
    return None


def _postfix(bracket: str) -> dict[str, str]:
    """The ``name=value`` pairs tqdm shows after the rate (``set_postfix``, Lightning's metrics)."""
    return dict(item.split("=", 1) for item in bracket.split(", ") if "=" in item)


def read_accelerate_steps_bar(line: str) -> StepMetrics | None:
    """A step of a training script built on Hugging Face Accelerate, from the bar its rank 0
    draws: ``tqdm(range(0, max_train_steps), initial=global_step, desc="Steps")``, updated once
    per optimizer step (``accelerator.sync_gradients``) and given the step's numbers with
    ``set_postfix(step_loss=..., lr=...)``, as diffusers' training examples draw it::

        Steps:  40%|####      | 4/10 [00:01<00:01,  3.05it/s, lr=0.0001, step_loss=0.123]

    The last draw in the line gives ``step`` and ``steps``, the postfix's ``step_loss`` (or
    ``loss``, ``train_loss``: the rank's last micro-batch loss, 3 significant digits) and
    ``lr``. None for a bar of unknown length, a line over MAX_LINE_BYTES and any other line."""
    if "Steps:" not in line or "%|" not in line or len(line) > MAX_LINE_BYTES:
        return None
    for match in reversed(_tqdm_draws(line)):
        desc, n, total, bracket = match.groups()
        if desc != "Steps:":
            continue
        if total == "?":
            return None
        shown = _postfix(bracket)
        loss = next((_float(shown[name]) for name in ACCELERATE_LOSS_NAMES if name in shown), None)
        return StepMetrics(step=int(n), steps=int(total), loss=loss, lr=_float(shown.get("lr")))
    return None


# --- Trainers' own step lines -----------------------------------------------------------------
# One reader per line form: what it reads and from which code is in the module docstring and
# docs/observability.md; the lines they were tested on are in tests/fixtures/trainer-output/.
# Each turns a line down with substring checks before any regex: the watchdog reads every line
# of every rank.

_NUMBER = r"(?:[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?nan|[-+]?inf)"
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
GIB = 2**30

# DeepSpeed 0.19 engine.py _report_progress: log_dist(f"step={step}, skipped={...}, lr={lr}, mom={mom}")
# on rank 0, which prefixes "[Rank 0] ". lr is a list, one per parameter group, whose items print
# as 0.001, tensor(0.001) or np.float64(0.001) as the scheduler keeps them: the first one is read.
DEEPSPEED_STEP_MARK = ", skipped="
_DEEPSPEED_STEP_RE = re.compile(
    rf"(?:\[Rank (-?\d+)\] )?\bstep=(\d+), skipped=(\d+), lr=\[(?:(?:[\w.]*\()?({_NUMBER}))?")
# DeepSpeed 0.19 utils/timer.py ThroughputTimer.stop, every steps_per_print global steps on rank 0.
DEEPSPEED_THROUGHPUT_MARK = ", RunningAvgSamplesPerSec="
_DEEPSPEED_THROUGHPUT_RE = re.compile(
    rf"\bepoch=\d+/micro_step=\d+/global_step=(\d+), RunningAvgSamplesPerSec=({_NUMBER}), "
    rf"CurrSamplesPerSec=({_NUMBER})(?:, MemAllocated={_NUMBER}GB, MaxMemAllocated=({_NUMBER})GB)?")
# torchtitan components/metrics.py MetricsProcessor.log: "step: {step:2}  loss: {loss:8.5f}  ...",
# each field behind its own colour code unless metrics.disable_color_printing. Its validation line
# ("validate step: ...") is not a training step. Before 4d182a13e (2024-11-23) tps was called wps.
_TITAN_STEP_RE = re.compile(rf"(?<!validate )\bstep:\s*(\d+)\s+loss:\s*({_NUMBER})\s")
_TITAN_FIELDS = {"grad_norm": re.compile(rf"\bgrad_norm:\s*({_NUMBER})"),
                 "memory_gib": re.compile(rf"\bmemory:\s*({_NUMBER})GiB"),
                 "tps": re.compile(r"\b[tw]ps:\s*(\d[\d,]*)"),
                 "tflops": re.compile(r"\btflops:\s*(\d[\d,]*(?:\.\d+)?)"),
                 "mfu_pct": re.compile(rf"\bmfu:\s*({_NUMBER})%")}
# Megatron-LM training/training.py training_log: " iteration {:8d}/{:8d} | key: value | ...", the
# losses keyed by what the model's loss function reports ("lm loss" for GPT, BERT, the multimodal
# and MIMO examples), printed by the last rank.
MEGATRON_MARK = " | consumed samples:"
_MEGATRON_STEP_RE = re.compile(r"\biteration\s+(\d+)/\s*(\d+) \|")
_MEGATRON_FIELD_RE = re.compile(r"\|\s*([^|:]+?):\s*([^|]*?)\s*(?=\|)")
# The line's fields kept in extra, by the names they get there (the others are read into fields).
_MEGATRON_EXTRA = {"consumed samples": "consumed_samples", "global batch size": "global_batch_size",
                   "grad norm": "grad_norm", "loss scale": "loss_scale",
                   "throughput per GPU (TFLOP/s/GPU)": "tflops", "number of skipped iterations": "skipped_iterations",
                   "number of nan iterations": "nan_iterations"}
_MEGATRON_COUNTS = frozenset(("consumed_samples", "global_batch_size", "skipped_iterations", "nan_iterations"))


def read_deepspeed_step(line: str) -> StepMetrics | None:
    """Step, learning rate (the first parameter group's) and rank from DeepSpeed's engine line
    ``[Rank 0] step=10, skipped=0, lr=[0.001], mom=[(0.9, 0.999)]``; the skipped steps (fp16
    overflows) in ``extra``. ``step`` is the engine's global step count, 0 for the line
    ``deepspeed.initialize`` prints before the first step."""
    if DEEPSPEED_STEP_MARK not in line or ", lr=[" not in line:
        return None
    match = _DEEPSPEED_STEP_RE.search(line)
    if match is None:
        return None
    rank, step, skipped, lr = match.groups()
    return StepMetrics(step=int(step), lr=_float(lr), rank=int(rank) if rank and int(rank) >= 0 else None,
                       extra={"skipped_steps": int(skipped)})


def read_deepspeed_throughput(line: str) -> StepMetrics | None:
    """The global step of DeepSpeed's ThroughputTimer line (``epoch=0/micro_step=20/global_step=10,
    RunningAvgSamplesPerSec=..., CurrSamplesPerSec=..., MemAllocated=..GB, MaxMemAllocated=..GB``)
    and, in ``extra``, the job's samples/s over the last step (``samples_per_s``) and since the
    timer's start step (``avg_samples_per_s``) and the allocator's allocated peak in bytes
    (``max_memory_allocated_bytes``, to 0.01 GiB). Samples are not tokens: ``tokens_per_s`` is None."""
    if DEEPSPEED_THROUGHPUT_MARK not in line:
        return None
    match = _DEEPSPEED_THROUGHPUT_RE.search(line)
    if match is None:
        return None
    step, average, current, peak_gib = match.groups()
    extra = {"samples_per_s": _float(current), "avg_samples_per_s": _float(average)}
    peak = _float(peak_gib)
    if peak is not None and math.isfinite(peak):
        extra["max_memory_allocated_bytes"] = round(peak * GIB)
    return StepMetrics(step=int(step), extra={k: v for k, v in extra.items() if v is not None})


def read_torchtitan(line: str) -> StepMetrics | None:
    """Step, loss, tokens/s (``tps``: this rank's, scope "rank") and the reserved peak memory
    (``memory: 9.46GiB(64.99%)``, to 0.01 GiB) from torchtitan's step line, its ANSI colour codes
    allowed; grad_norm, tflops and mfu (percent; "N/A" under FP8/MX) in ``extra``."""
    if "step:" not in line or "loss:" not in line or "ps:" not in line:
        return None
    if "\x1b[" in line:
        line = _ANSI_RE.sub("", line)
    match = _TITAN_STEP_RE.search(line)
    if match is None:
        return None
    rest = line[match.end():]
    found = {name: pattern.search(rest) for name, pattern in _TITAN_FIELDS.items()}
    values = {name: _float(got.group(1).replace(",", "")) if got else None for name, got in found.items()}
    if values["tps"] is None:
        return None  # step and loss alone: not torchtitan's line
    gib = values.pop("memory_gib")
    tps = values.pop("tps")
    return StepMetrics(step=int(match.group(1)), loss=_float(match.group(2)), tokens_per_s=tps, scope="rank",
                       memory_bytes=round(gib * GIB) if gib is not None and math.isfinite(gib) else None,
                       extra={k: v for k, v in values.items() if v is not None})


def read_megatron(line: str) -> StepMetrics | None:
    """Iteration, final iteration, ``lm loss``, learning rate and step time (``elapsed time per
    iteration (ms)``) from Megatron-LM's training log line; consumed samples, global batch size,
    grad norm, loss scale, TFLOP/s per GPU and the skipped and NaN iterations in ``extra``. A
    model whose loss has another name gives no loss. No tokens/s: the line counts samples."""
    if MEGATRON_MARK not in line or "iteration" not in line:
        return None
    match = _MEGATRON_STEP_RE.search(line)
    if match is None:
        return None
    fields = dict(_MEGATRON_FIELD_RE.findall(line, match.end() - 1))
    step_ms = _float(fields.get("elapsed time per iteration (ms)"))
    extra: dict[str, Any] = {}
    for key, name in _MEGATRON_EXTRA.items():
        value = _float(fields.get(key))
        if value is not None:
            extra[name] = int(value) if name in _MEGATRON_COUNTS and value.is_integer() else value
    return StepMetrics(step=int(match.group(1)), steps=int(match.group(2)), loss=_float(fields.get("lm loss")),
                       lr=_float(fields.get("learning rate")), step_s=step_ms / 1000 if step_ms is not None else None,
                       extra=extra)


TRAINER_FORMATS: tuple[tuple[str, Callable[[str], StepMetrics | None]], ...] = (
    (TRANSFORMERS, read_transformers_trainer),
    ("Lightning Trainer", read_lightning),
    ("Accelerate steps bar", read_accelerate_steps_bar),
    ("DeepSpeed engine", read_deepspeed_step),
    ("DeepSpeed ThroughputTimer", read_deepspeed_throughput),
    ("torchtitan", read_torchtitan),
    ("Megatron-LM", read_megatron),
)
"""A trainer's own step line: its name (a :class:`StepReading`'s ``source``) and its reader, tried
in this order by :func:`read_step` after the metric line and before the progress line."""
