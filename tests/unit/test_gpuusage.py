"""`fstrain status`'s GPU column: nvidia-smi's CSV as a node prints it, read by the pure core;
and the stdlib node side (fstrain/io/remote/runctl.py) that finds a run's live ranks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fstrain.core.monitor.gpuusage import USAGE_QUERY, from_node, gpu_usage, usage_cell
from fstrain.io.remote import runctl

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "misc"


def test_the_real_csv_is_read_by_its_header_and_units() -> None:
    # A real 4x A100-SXM4-80GB capture (SOURCES.md): header `memory.total [MiB]`, values `81920 MiB`;
    # fields the status query asks for and this capture lacks come back as None.
    text = (FIXTURES / "nvidia-smi-query-gpu-csv_a100-sxm4-80gb-4x.csv").read_text()
    gpus = gpu_usage(text)
    assert [g["index"] for g in gpus] == [0, 1, 2, 3]
    assert {g["memory_total_mib"] for g in gpus} == {81920.0}
    assert {g["memory_used_mib"] for g in gpus} == {None} and {g["utilization_percent"] for g in gpus} == {None}
    assert usage_cell(gpus[:2]) == "0:?/81920MiB ? 1:?/81920MiB ?"


def test_the_status_query_with_percent_units_and_a_gpu_without_utilisation() -> None:
    # The layout nvidia-smi prints for USAGE_QUERY; under MIG the utilisation is [N/A].
    text = ("index, memory.used [MiB], memory.total [MiB], utilization.gpu [%]\n"
            "0, 61234 MiB, 143771 MiB, 97 %\n"
            "1, 4 MiB, 143771 MiB, [N/A]\n")
    gpus = gpu_usage(text)
    assert gpus == [
        {"index": 0, "memory_used_mib": 61234.0, "memory_total_mib": 143771.0, "utilization_percent": 97.0},
        {"index": 1, "memory_used_mib": 4.0, "memory_total_mib": 143771.0, "utilization_percent": None}]
    assert usage_cell(gpus) == "0:61234/143771MiB 97% 1:4/143771MiB ?"


def test_what_a_node_answers_becomes_gpus_or_one_reason() -> None:
    assert from_node({}, "node1") == ([], None)  # no nvidia-smi: a CPU node, nothing to say
    assert from_node(None, "node1") == ([], None)
    failed = {"error": "nvidia-smi exited 9: NVIDIA-SMI has failed because it couldn't communicate with the "
                       "NVIDIA driver."}
    assert from_node(failed, "node1") == ([], failed["error"])
    gpus, error = from_node({"csv": "index, memory.used [MiB]\n0, 1, 2\n"}, "node1")
    assert gpus == [] and error is not None and "node1" in error and "2 fields" in error
    assert usage_cell([]) == "" and usage_cell([], None) == ""
    assert usage_cell([], failed["error"]) == f"({failed['error']})"  # the node's reason, in brackets


def test_the_node_side_asks_what_the_core_reads() -> None:
    assert runctl.GPU_QUERY == USAGE_QUERY


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
def test_live_ranks_are_found_by_their_environment(tmp_path: Path) -> None:
    env = {**os.environ, "RANK": "5", "FSTRAIN_RUN_ID": "run-a", "SLURM_JOB_ID": "42", "SLURMD_NODENAME": "node2"}
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        deadline = time.monotonic() + 10
        while runctl.ranks_alive({"FSTRAIN_RUN_ID": "run-a"}) != [5] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert runctl.ranks_alive({"FSTRAIN_RUN_ID": "run-a"}) == [5]
        assert runctl.ranks_alive({"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "node2"}) == [5]
        assert runctl.ranks_alive({"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "node1"}) == []  # another node's
        assert runctl.ranks_alive({"FSTRAIN_RUN_ID": "run-b"}) == []
    finally:
        rank.kill()
        rank.wait()
    assert runctl.ranks_alive({"FSTRAIN_RUN_ID": "run-a"}) == []


def test_gpus_on_a_node_without_nvidia_smi_is_empty(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert runctl.gpus() == {}
