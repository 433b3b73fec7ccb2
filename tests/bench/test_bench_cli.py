"""`fstrain bench` as a user runs it on this machine (localhost through the launch path), and its
input errors (one line, exit 2, nothing contacted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import REPO, run_fstrain


@pytest.mark.parametrize(("args", "line"), [
    (["--suite", "gpu"], "error: --suite: unknown suite gpu in 'gpu' (hint: use collectives, pairs, compute or all)"),
    (["--sizes", "8G-1M"], "error: --sizes: range '8G-1M' runs backwards (hint: write the smaller size first, "
                           "e.g. 1M-1G)"),
    (["--pairs", "star"], "error: --pairs: unknown pairs mode 'star' (hint: use all, ring or auto)"),
    (["--backend", "mpi"], "error: --backend: unknown backend 'mpi' (hint: use nccl or gloo)"),
    (["--pair-bytes", "lots"], "error: --pair-bytes: cannot read 'lots' as a size (hint: write a byte count such "
                               "as 8, 64K, 1M or 1G)"),
    (["--suite", "pairs", "--model", "tiny"], "error: --model: the compute suite times a model's GEMMs, and --suite "
                                              "pairs leaves it out (hint: add compute to --suite)"),
    (["--model", "llama3.1-8b", "--tp", "3"], "error: --tp: 3 does not divide the q projection's width 4096 (hint: "
                                              "give a --tp that divides the model's widths (heads, FFN))"),
    (["--gemm-dtype", "int8"], "error: --gemm-dtype: unknown GEMM dtype 'int8' (hint: use auto, bf16, fp16 or fp32)"),
    (["--max-gemm-flops", "lots"], "error: --max-gemm-flops: cannot read 'lots' as a positive FLOP count (hint: "
                                   "write e.g. 2e10)"),
    (["--hosts", "nowhere", "--out", "/nonexistent-dir/x.json"],
     "error: /nonexistent-dir/x.json: the folder for --out does not exist (hint: create it first or give another "
     "path)"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], line: str, tmp_path: Path) -> None:
    result = run_fstrain("bench", "--run-dir", str(tmp_path / "run"), *args)
    assert result.returncode == 2
    assert result.stderr.strip() == line
    assert result.stdout == ""
    assert not (tmp_path / "run").exists()  # nothing ran


def test_collectives_and_compute_with_a_models_gemms_on_localhost(tmp_path: Path) -> None:
    """Two CPU ranks; `--model tiny`: the compute suite times the GEMMs the planner prices for tiny
    at 2 x 128 tokens, and `plan --calibrate` reads the result."""
    from fstrain.core.plan.gemmshapes import model_gemms
    from fstrain.io.recipes import load_shipped_recipe

    run_dir, out = tmp_path / "run", tmp_path / "result.json"
    result = run_fstrain("bench", "--suite", "collectives,compute", "--sizes", "256K", "--seconds", "0.05",
                         "--model", "tiny", "--micro-batch", "2", "--nproc-per-node", "2", "--workdir", str(REPO),
                         "--run-dir", str(run_dir), "--out", str(out), "--json", timeout=600)
    assert result.returncode in (0, 1), result.stderr[-3000:]
    document = json.loads(result.stdout)
    assert document == json.loads(out.read_text()) == json.loads((run_dir / "bench.json").read_text())
    assert document["world_size"] == 2 and document["backend"] == "gloo"
    assert [s["scope"] for s in document["collectives"]["scopes"]] == ["world"]
    assert len(document["compute"]["per_rank"]) == 2
    stragglers = document["analysis"]["compute"]["stragglers"]
    assert result.returncode == (1 if stragglers else 0)
    report = (run_dir / "report.txt").read_text()
    assert "collectives: bus bandwidth at the largest size" in report
    assert "compute: matmul TFLOPS per rank" in report
    assert (run_dir / "manifest.json").is_file() and (run_dir / "logs").is_dir()
    # The human report went to stderr; stdout is the one document.
    assert "world all_reduce (2 ranks)" in result.stderr
    # The GEMM sweep: exactly the planner's shapes for tiny, on both ranks; each shape at its slowest rank.
    gemm = document["compute"]["gemm"]
    assert gemm["grid"] == "model"
    assert gemm["model"] == {"name": "tiny", "seq_len": 128, "micro_batch": 2, "tp": 1, "tokens": 256}
    expected = [(s.m, s.n, s.k, s.label) for s in model_gemms(load_shipped_recipe("tiny").model, 256)]
    for rank in gemm["per_rank"]:
        assert [(p["m"], p["n"], p["k"], p["label"]) for p in rank["points"]] == expected
    shapes = document["analysis"]["gemm"]["shapes"]
    for shape in shapes:
        rates = [p["tflops"]["median"] for r in gemm["per_rank"] for p in r["points"]
                 if (p["m"], p["n"], p["k"]) == (shape["m"], shape["n"], shape["k"])]
        assert shape["tflops"] == min(rates)
    assert max(s["fraction_of_best"] for s in shapes) == 1.0
    assert f"compute: GEMM TFLOP/s, tiny at 2 x 128 tokens, tp 1, {gemm['dtype']}" in report
    assert "256x128x128" in report and "q fwd, q dgrad" in result.stderr
    # plan --calibrate reads the curve, and leaves it out of a GPU plan: a CPU's rates are not an H100's.
    name = gemm["per_rank"][0]["device_name"]
    planned = run_fstrain("plan", "--model", "tiny", "--gpu", "h100-sxm", "--num-nodes", "1", "--calibrate", str(out),
                          "--json")
    assert planned.returncode == 0, planned.stderr
    calibration = json.loads(planned.stdout)["calibration"]
    assert calibration["gemm_curve"] is None
    assert f"GEMM curve ({len(expected)} GEMMs from {name}): measured on a CPU, and the plan is for H100-SXM GPUs" \
        in calibration["ignored"]


def _saved(tmp_path: Path, slow_into: str | None) -> Path:
    nodes = ["node1", "node2", "node3"]
    links = [{"src": a, "dst": b, "samples_gbps": [0.05 if b == slow_into else 1.0]}
             for a in nodes for b in nodes if a != b]
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"schema": "fstrain.bench/1", "suites": ["pairs"], "nodes": nodes, "run_id": "r1",
                                "world_size": 3, "num_nodes": 3, "pairs": {"size": "16M", "links": links}}))
    return path


def test_from_file_prints_the_report_and_the_verdict_again_contacting_nobody(tmp_path: Path) -> None:
    path = _saved(tmp_path, "node2")
    # --hosts names a host that does not exist: nothing is contacted, so nothing fails.
    result = run_fstrain("bench", "--from", str(path), "--hosts", "nowhere.invalid", "--json")
    assert result.returncode == 1, result.stderr
    assert "pairs: outlier host node2: traffic into it is slow" in result.stderr
    assert "node1     |" in result.stderr  # a sender row of the matrix
    assert json.loads(result.stdout)["analysis"]["outlier_hosts"] == ["node2"]
    healthy = run_fstrain("bench", "--from", str(_saved(tmp_path, None)))
    assert healthy.returncode == 0 and "pairs: no outliers" in healthy.stderr


@pytest.mark.parametrize(("content", "message"), [
    (None, "file not found (hint: check the path)"),
    ("{", "cannot read JSON"),
    ('{"losses": [1]}', "not an fstrain bench document"),
])
def test_from_a_bad_file_is_one_line_and_exit_2(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "bench.json"
    if content is not None:
        path.write_text(content)
    result = run_fstrain("bench", "--from", str(path))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith(f"error: {path}: {message}")


def test_calibrating_from_a_bench_that_named_outliers_warns(tmp_path: Path) -> None:
    args = ["plan", "--model", "tiny", "--num-nodes", "3", "--gpu", "h100-sxm", "--calibrate"]
    named = run_fstrain(*args, str(_saved(tmp_path, "node2")))
    assert named.returncode == 0, named.stderr
    (line,) = [x for x in named.stderr.splitlines() if x.startswith("warning:")]
    assert "the bench named outliers (node2)" in line and "--exclude node2" in line
    clean = run_fstrain(*args, str(_saved(tmp_path, None)))
    assert clean.returncode == 0 and "warning:" not in clean.stderr
