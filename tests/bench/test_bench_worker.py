"""``python -m fstrain.bench`` run as a user runs it: real processes, gloo on CPU.

Each run is a subprocess, so torch's own warnings stay out of pytest's filterwarnings=error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fstrain.core.bench.gemm import CPU_GRID_TOP, default_grid

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = str(REPO)
    env["OMP_NUM_THREADS"] = "1"
    return env


def run_worker(args: list[str], out: Path, nproc: int = 0, timeout: int = 300) -> dict[str, Any]:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    cmd = [*(launcher if nproc else [sys.executable]), "-m", "fstrain.bench", *args, "--json-out", str(out)]
    done = subprocess.run(cmd, env=_env(), cwd=out.parent, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    document: dict[str, Any] = json.loads(out.read_text())
    return document


def test_compute_standalone_on_cpu(tmp_path: Path) -> None:
    doc = run_worker(["--suite", "compute", "--compute-seconds", "0.3", "--gemm-seconds", "0.02",
                      "--cpu-adamw-elements", str(1 << 18)], tmp_path / "c.json")
    assert doc["schema"] == "fstrain.bench/1" and doc["world_size"] == 1
    (rank,) = doc["compute"]["per_rank"]
    matmul, memory = rank["matmul"], rank["memory"]
    assert matmul["dtype"] == "float32" and matmul["size"] == 1024
    assert len(matmul["samples_tflops"]) >= 3 and matmul["tflops"]["median"] > 0
    # Each sample is FLOPs / seconds: the two lists agree.
    first = matmul["flops_per_op"] * matmul["ops_per_sample"] / matmul["samples_seconds"][0] / 1e12
    assert matmul["samples_tflops"][0] == pytest.approx(first)
    assert memory["bytes_moved_per_op"] == 2 * memory["bytes"] and memory["gbps"]["median"] > 0
    # The host's AdamW: parameters / seconds of each sample, one thread as the test's launcher set
    adamw = rank["cpu_adamw"]
    assert adamw["kind"] == "torch_adamw" and adamw["elements"] == 1 << 18 and adamw["threads"] == 1
    assert adamw["samples_params_per_s"][0] == pytest.approx(
        adamw["elements"] * adamw["steps_per_sample"] / adamw["samples_seconds"][0])
    assert 1e6 < adamw["params_per_s"]["median"] < 1e11
    # The GEMM sweep: the default grid at the CPU's size, in the dtype the CPU runs faster.
    gemm = doc["compute"]["gemm"]
    assert gemm["grid"] == "default" and gemm["model"] is None and gemm["skipped"] == []
    probe = gemm["dtype_probe_tflops"]
    assert gemm["dtype"] == ("bfloat16" if probe["bf16"] > probe["fp32"] else "float32")
    (swept,) = gemm["per_rank"]
    assert [(p["m"], p["n"], p["k"]) for p in swept["points"]] == [(s.m, s.n, s.k) for s in default_grid(CPU_GRID_TOP)]
    for point in swept["points"]:
        assert point["flops_per_op"] == 2 * point["m"] * point["n"] * point["k"] and point["tflops"]["median"] > 0
        assert point["dtype"] == gemm["dtype"] and len(point["samples_tflops"]) >= 3


def test_gemm_shapes_given_and_the_cap_on_cpu(tmp_path: Path) -> None:
    doc = run_worker(["--suite", "compute", "--compute-seconds", "0.05", "--gemm-seconds", "0.02", "--gemm-dtype",
                      "fp32", "--gemm-shapes", "64x32x16=q fwd;4096x4096x4096=big", "--max-gemm-flops", "1e9",
                      "--gemm-model", '{"name": "x"}'], tmp_path / "g.json")
    gemm = doc["compute"]["gemm"]
    assert gemm["grid"] == "model" and gemm["model"] == {"name": "x"} and gemm["dtype"] == "float32"
    ((point,),) = [r["points"] for r in gemm["per_rank"]]
    assert (point["m"], point["n"], point["k"], point["label"]) == (64, 32, 16, "q fwd")
    assert gemm["skipped"] == [{"m": 4096, "n": 4096, "k": 4096, "label": "big", "flops": 2 * 4096**3}]


def test_collectives_two_ranks_gloo(tmp_path: Path) -> None:
    doc = run_worker(["--suite", "collectives", "--sizes", "256K-512K", "--seconds", "0.05", "--backend", "gloo"],
                     tmp_path / "k.json", nproc=2)
    assert doc["backend"] == "gloo" and doc["world_size"] == 2 and doc["num_nodes"] == 1
    (scope,) = doc["collectives"]["scopes"]  # one node: intra == world, no inter
    assert scope["scope"] == "world"
    rows = scope["results"]
    assert {r["collective"] for r in rows} == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                              "broadcast"}
    assert {r["size_bytes"] for r in rows} >= {256 << 10, 512 << 10, 8}
    for row in rows:
        assert len(row["samples_seconds"]) >= 3
        median_s = row["time_us"]["median"] / 1e6
        assert row["algbw_gbps"] == pytest.approx(row["size_bytes"] / median_s / 1e9)
        factor = {"all_reduce": 1.0, "broadcast": 1.0}.get(row["collective"], 0.5)
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * factor)
        assert row["latency_size"] == (row["size_bytes"] < 256 << 10)


def test_collectives_world_of_one_reports_algbw_and_zero_busbw(tmp_path: Path) -> None:
    doc = run_worker(["--suite", "collectives", "--sizes", "64K", "--collectives", "all_reduce,broadcast",
                      "--no-latency", "--seconds", "0.05"], tmp_path / "one.json")
    rows = doc["collectives"]["scopes"][0]["results"]
    assert len(rows) == 2
    assert all(r["algbw_gbps"] > 0 and r["busbw_gbps"] == 0 for r in rows)


def test_bad_suite_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "fstrain.bench", "--suite", "gpu", "--json-out",
                           str(tmp_path / "x.json")], env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("error: --suite: unknown suite gpu in 'gpu'")
    assert not (tmp_path / "x.json").exists()
    shapes = subprocess.run([sys.executable, "-m", "fstrain.bench", "--suite", "compute", "--gemm-shapes", "8x8",
                             "--json-out", str(tmp_path / "x.json")], env=_env(), capture_output=True, text=True,
                            timeout=120)
    assert shapes.returncode == 2
    assert shapes.stderr.strip().splitlines()[-1] == ("error: --gemm-shapes: cannot read '8x8' as a GEMM shape "
                                                      "(hint: write MxNxK, e.g. 4096x4096x4096)")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_pairs_and_scopes_over_two_torchrun_nodes_on_loopback(tmp_path: Path) -> None:
    """Two torchrun agents with two ranks each, as two nodes would start them."""
    port = str(_free_port())
    out = tmp_path / "p.json"
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}",
             "--nproc-per-node=2", "--master-addr=127.0.0.1", f"--master-port={port}",
             "-m", "fstrain.bench", "--suite", "pairs,collectives", "--collectives", "all_reduce", "--sizes", "256K",
             "--no-latency", "--seconds", "0.05", "--pair-bytes", "1M", "--pair-samples", "3", "--json-out", str(out)],
            env=_env(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for node in (0, 1)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
    doc = json.loads(out.read_text())
    assert doc["num_nodes"] == 2 and doc["world_size"] == 4
    # Both "nodes" share this host's name: they are told apart by torchrun's node rank.
    assert len(set(doc["nodes"])) == 2
    links = doc["pairs"]["links"]
    assert {(x["src"], x["dst"]) for x in links} == {(doc["nodes"][0], doc["nodes"][1]),
                                                     (doc["nodes"][1], doc["nodes"][0])}
    assert all(len(x["samples_gbps"]) == 3 and min(x["samples_gbps"]) > 0 for x in links)
    scopes = {s["scope"]: s for s in doc["collectives"]["scopes"]}
    assert scopes["intra_node"]["groups"] == [[0, 1], [2, 3]]
    assert scopes["inter_node"]["groups"] == [[0, 2], [1, 3]]
    assert len(scopes["inter_node"]["results"]) == 2  # one row per group
