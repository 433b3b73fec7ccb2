"""The node's Prometheus textfile (fstrain.core.monitor.promfile), as values: what it reads from
the ranks' lines, and a text that Prometheus's own parser (prometheus_client) reads back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fstrain.core.monitor.metricline import StepMetrics, format_metric_line, newer_reading, newer_step, read_step
from fstrain.core.monitor.promfile import NODE_METRICS, RANK_METRICS, NodeMetrics, textfile_name

NAMES = [name for name, *_ in RANK_METRICS + NODE_METRICS]
FIXTURES = Path(__file__).parent.parent / "fixtures" / "trainer-output"


def families(text: str) -> dict[str, dict[str, object]]:
    """name -> {"type", "help", "samples": [(sample name, labels, value)]}."""
    return {f.name: {"type": f.type, "help": f.documentation, "samples": [(s.name, s.labels, s.value)
                                                                          for s in f.samples]}
            for f in text_string_to_metric_families(text)}


def node(nproc: int = 2, offset: int | None = 2) -> NodeMetrics:
    return NodeMetrics('run-"1"', "node\\a", 1, nproc, offset, started=100.0, read_step=read_step,
                       newer_reading=newer_reading)


def samples(found: dict[str, dict[str, object]], name: str) -> dict[str, float]:
    """local rank -> value of a per-rank metric."""
    return {labels["local_rank"]: value for _, labels, value in found[name]["samples"]}  # type: ignore[attr-defined]


def test_metric_lines_become_one_series_per_rank_with_help_and_type() -> None:
    metrics = node()
    metrics.line(0, format_metric_line(StepMetrics(step=5, steps=20, loss=2.5, lr=1e-4, tokens_per_s=900.0,
                                                   step_s=0.25, memory_bytes=2**30, rank=2)), now=110.0)
    metrics.line(None, "[local1]:" + format_metric_line(StepMetrics(step=4, loss=float("nan"), tokens_per_s=40.0,
                                                                    scope="rank", rank=3)), now=112.0)
    metrics.set_alive({0: 2})
    metrics.restarts = 1
    text = metrics.render(now=115.0)
    found = families(text)
    assert sorted(found) == sorted(name.removesuffix("_total") for name in NAMES)
    assert all(f["help"] for f in found.values())
    assert (found["fstrain_step"]["type"], found["fstrain_restarts"]["type"]) == ("gauge", "counter")
    assert samples(found, "fstrain_step") == {"0": 5.0, "1": 4.0}
    assert samples(found, "fstrain_final_step") == {"0": 20.0}  # rank 1 did not say
    assert samples(found, "fstrain_rank_alive") == {"0": 1.0, "1": 0.0}
    assert samples(found, "fstrain_last_output_age_seconds") == {"0": 5.0, "1": 3.0}
    assert samples(found, "fstrain_memory_bytes") == {"0": 2.0**30}
    [(_, labels, _), (_, labels1, _)] = found["fstrain_tokens_per_second"]["samples"]  # type: ignore[misc]
    assert labels == {"run_id": 'run-"1"', "host": "node\\a", "node_rank": "1", "rank": "2", "local_rank": "0",
                      "scope": "job"}
    assert (labels1["rank"], labels1["scope"]) == ("3", "rank")
    node_labels = {"run_id": 'run-"1"', "host": "node\\a", "node_rank": "1"}
    assert found["fstrain_restarts"]["samples"] == [("fstrain_restarts_total", node_labels, 1.0)]
    assert samples(found, "fstrain_loss") == {"0": 2.5}  # rank 1's NaN went out as null: no sample
    written = found["fstrain_textfile_written_timestamp_seconds"]
    assert written["type"] == "gauge" and written["samples"] == [
        ("fstrain_textfile_written_timestamp_seconds", node_labels, 115.0)]
    assert states(found) == {"running": 1.0, "succeeded": 0.0, "failed": 0.0, "stopped": 0.0}
    assert found["fstrain_exit_code"]["samples"] == []  # not known while the job runs


def states(found: dict[str, dict[str, object]]) -> dict[str, float]:
    return {labels["state"]: value for _, labels, value in found["fstrain_run_state"]["samples"]}  # type: ignore[attr-defined]


@pytest.mark.parametrize(("exit_code", "stopped", "state"), [(0, False, "succeeded"), (3, False, "failed"),
                                                             (143, True, "stopped"), (0, True, "stopped"),
                                                             (None, False, "failed")])
def test_the_end_says_the_state_and_exit_code_and_no_rank_alive(exit_code: int | None, stopped: bool,
                                                               state: str) -> None:
    metrics = node()
    metrics.line(0, format_metric_line(StepMetrics(step=5, rank=2)), now=110.0)
    metrics.set_alive({0: 2, 1: 3})
    metrics.end(exit_code, stopped)
    found = families(metrics.render(now=120.5))
    assert samples(found, "fstrain_rank_alive") == {"0": 0.0, "1": 0.0}
    assert samples(found, "fstrain_step") == {"0": 5.0}  # the last numbers stay
    assert [s for s, value in states(found).items() if value == 1.0] == [state]
    assert [value for *_, value in found["fstrain_exit_code"]["samples"]] == (  # type: ignore[attr-defined]
        [] if exit_code is None else [float(exit_code)])
    [(_, _, written)] = found["fstrain_textfile_written_timestamp_seconds"]["samples"]  # type: ignore[misc]
    assert written == 120.5


def test_progress_lines_count_only_where_a_rank_prints_no_metric_line() -> None:
    metrics = node(nproc=1, offset=None)
    metrics.line(None, "[fstrain.train] step 3/10 loss 4.2500 lr 1.000e-04 tokens/s 12,345 max_rss_bytes=1MiB", 101.0)
    found = families(metrics.render(102.0))
    assert (samples(found, "fstrain_step"), samples(found, "fstrain_loss")) == ({"0": 3.0}, {"0": 4.25})
    assert samples(found, "fstrain_tokens_per_second") == {"0": 12345.0}
    [(_, labels, _)] = found["fstrain_step"]["samples"]  # type: ignore[misc]
    assert labels["rank"] == ""  # not known yet: no offset, no metric line, not seen alive
    metrics.line(0, format_metric_line(StepMetrics(step=4, loss=4.0, rank=0)), 103.0)
    metrics.line(0, "[fstrain.train] step 9/10 loss 1.0000", 104.0)
    found = families(metrics.render(105.0))
    assert samples(found, "fstrain_step") == {"0": 4.0}
    [(_, labels, _)] = found["fstrain_step"]["samples"]  # type: ignore[misc]
    assert labels["rank"] == "0"


def test_lines_without_a_known_rank_and_odd_lines_are_left_out() -> None:
    metrics = node(nproc=2, offset=None)
    metrics.line(None, format_metric_line(StepMetrics(step=1, rank=7)), 101.0)  # no tag, no offset: whose?
    metrics.line(0, "FSTRAIN_METRICS {not json", 102.0)
    metrics.line(1, "FSTRAIN_METRICS " + json.dumps({"v": 99, "step": 1}), 103.0)
    found = families(metrics.render(104.0))
    assert found["fstrain_step"]["samples"] == []
    assert samples(found, "fstrain_last_output_age_seconds") == {"0": 2.0, "1": 1.0}  # still output


def test_the_file_name_is_one_per_run_and_node() -> None:
    assert textfile_name("20261201-120000-abc123", 3) == "fstrain_20261201-120000-abc123_node3.prom"


def test_each_rank_holds_what_status_folds_from_the_same_lines() -> None:
    """The textfile and `status` keep a rank's numbers by one rule (metricline.newer_reading),
    the textfile without a program's bare ``step N`` (any_program=False): after every line, each
    sample is the folded reading's field, the tokens/s labelled with its scope."""
    lines = [
        # a transformers Trainer's bar, then its log dict alone (stdout in a file of its own): the
        # dict's numbers go to the step the bar last drew (as printed by tests/train/programs/hf_trainer.py)
        "\r  0%|          | 0/6 [00:00<?, ?it/s]\r 17%|█▋        | 1/6 [00:00<00:00, 15.47it/s]"
        "\r 33%|███▎      | 2/6 [00:00<00:00, 19.01it/s]",
        "{'loss': '4.037', 'grad_norm': '1.049', 'learning_rate': '0.0005', 'epoch': '0.125'}",
        "[fstrain.train] step 3/10 loss 4.2500 lr 1.000e-04 tokens/s 12,345 max_rss_bytes=1MiB",
        "rank 0 step 4/10 loss 2.5",  # any program's step line: status reads it, the textfile does not
        *(FIXTURES / "deepspeed-engine.txt").read_text().splitlines()[-12:],  # two lines per step add up
        *(FIXTURES / "torchtitan-step.txt").read_text().splitlines()[:2],  # tokens/s of the rank
        format_metric_line(StepMetrics(step=20, loss=1.5, tokens_per_s=50.0, scope="job", rank=0)),
        "[fstrain.train] step 21/30 loss 1.0000",  # after a metric line: left out
        format_metric_line(StepMetrics(step=21, lr=2e-4, rank=0)),
    ]
    metrics, held = node(nproc=1, offset=0), None
    fields = {name: field for name, _, _, field in RANK_METRICS if field is not None}
    for number, line in enumerate(lines):
        metrics.line(0, line, 101.0 + number)
        held = newer_step(held, line, any_program=False)
        found = families(metrics.render(200.0))
        assert held is not None
        for name, field in fields.items():
            value = getattr(held.metrics, field)
            assert samples(found, name) == ({} if value is None else {"0": float(value)}), (line, name)
        if held.metrics.tokens_per_s is not None:
            [(_, labels, _)] = found["fstrain_tokens_per_second"]["samples"]  # type: ignore[misc]
            assert labels["scope"] == held.metrics.scope, line
    assert held is not None and held.metrics.step == 21 and held.metrics.lr == 2e-4
    metrics = node(nproc=1, offset=0)
    for line in lines[:2]:
        metrics.line(0, line, 101.0)
    found = families(metrics.render(200.0))
    assert (samples(found, "fstrain_step"), samples(found, "fstrain_loss")) == ({"0": 2.0}, {"0": 4.037})
