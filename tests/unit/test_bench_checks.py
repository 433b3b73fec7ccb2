"""doctor --bench: bench outliers as check verdicts with a fix."""

from __future__ import annotations

from typing import Any

from fstrain.core.bench.checks import bench_checks, bench_failed

HOSTS = ["n1", "n2", "n3"]


def _links(slow: dict[tuple[str, str], float]) -> list[dict[str, Any]]:
    return [{"src": a, "dst": b, "samples_gbps": [slow.get((a, b), 1.0)]} for a in HOSTS for b in HOSTS if a != b]


def _intra(busbw: list[float]) -> dict[str, Any]:
    return {"scope": "intra_node", "groups": [[0, 1], [2, 3], [4, 5]], "results": [
        {"collective": "all_reduce", "size_bytes": 1 << 24, "group": g, "time_us": {"median": 100.0},
         "algbw_gbps": b, "busbw_gbps": b} for g, b in enumerate(busbw)]}


def doc(links: list[dict[str, Any]], intra: list[float]) -> dict[str, Any]:
    return {"nodes": HOSTS, "pairs": {"links": links}, "collectives": {"scopes": [_intra(intra)]}}


def test_a_slow_host_fails_with_a_fix_naming_it() -> None:
    results = bench_checks(doc(_links({("n1", "n2"): 0.05, ("n3", "n2"): 0.06}), [10, 10, 10]), HOSTS)
    pairs = [r for r in results if r.id == "bench.pairs"]
    assert [(r.verdict, r.hosts) for r in pairs] == [("fail", ("n2",))]
    assert pairs[0].message.startswith("traffic into n2 is slow: 0.055 GB/s, 6 % of the median link (1 GB/s)")
    assert "--exclude n2" in pairs[0].fix
    assert [r.verdict for r in results if r.id == "bench.collectives"] == ["ok"]


def test_one_slow_link_warns_about_the_path() -> None:
    results = bench_checks(doc(_links({("n1", "n3"): 0.1}), [10, 10, 10]), HOSTS)
    (row,) = [r for r in results if r.id == "bench.pairs"]
    assert (row.verdict, row.hosts) == ("warn", ("n1", "n3"))
    assert "between n1 and n3" in row.fix


def test_even_cluster_is_ok_and_a_slow_node_all_reduce_warns() -> None:
    results = bench_checks(doc(_links({}), [10, 4, 11]), HOSTS)
    assert [(r.id, r.verdict, r.hosts) for r in results] == [
        ("bench.pairs", "ok", tuple(HOSTS)), ("bench.collectives", "warn", ("n2",))]
    assert "40 % of the median node (10 GB/s)" in results[1].message


def test_one_host_and_a_failed_run() -> None:
    results = bench_checks({"nodes": ["n1"], "pairs": {"links": []}, "collectives": {"scopes": []}}, ["n1"])
    assert [(r.id, r.verdict) for r in results] == [("bench.pairs", "skipped"), ("bench.collectives", "skipped")]
    (failed,) = bench_failed(3, "runs/x/logs", HOSTS)
    assert failed.verdict == "fail" and "runs/x/logs" in failed.fix
