"""The bench arithmetic: nccl-tests' bandwidth definitions, sizes, and the pairs outlier rule."""

from __future__ import annotations

import pytest

from fstrain.core.bench.arithmetic import (
    algbw_gbps,
    bus_bandwidth_factor,
    busbw_gbps,
    elements_for,
    format_size,
    parse_size,
    parse_sizes,
    summarize,
)
from fstrain.core.bench.pairs import analyze_links, link_table, pair_rounds
from fstrain.errors import InputError

# A published all_reduce_perf line (16 H100 ranks, 2 nodes, float sum; lessizzmore/
# create-a3mega-ztan-fork, file ztan-NCCL-test-result): size, time (us), algbw, busbw (GB/s).
NCCL_TESTS_ALL_REDUCE_16 = [
    (1073741824, 6759.0, 158.86, 297.86),
    (67108864, 1261.6, 53.20, 99.74),
    (8589934592, 47535, 180.71, 338.82),
]


@pytest.mark.parametrize(("size", "time_us", "algbw", "busbw"), NCCL_TESTS_ALL_REDUCE_16)
def test_all_reduce_matches_a_published_nccl_tests_line(size: int, time_us: float, algbw: float, busbw: float) -> None:
    assert algbw_gbps(size, time_us / 1e6) == pytest.approx(algbw, abs=0.01)
    assert busbw_gbps("all_reduce", size, time_us / 1e6, 16) == pytest.approx(busbw, abs=0.02)


@pytest.mark.parametrize(
    ("collective", "n", "factor"),
    [
        # nccl-tests doc/PERFORMANCE.md, "Summary": 2(n-1)/n, (n-1)/n, (n-1)/n, (n-1)/n, 1.
        ("all_reduce", 8, 1.75),
        ("all_reduce", 2, 1.0),
        ("all_gather", 8, 0.875),
        ("reduce_scatter", 4, 0.75),
        ("all_to_all", 16, 0.9375),
        ("broadcast", 8, 1.0),
        # One rank: nothing crosses a link.
        ("all_reduce", 1, 0.0),
        ("all_gather", 1, 0.0),
        ("broadcast", 1, 0.0),
    ],
)
def test_bus_bandwidth_factors(collective: str, n: int, factor: float) -> None:
    assert bus_bandwidth_factor(collective, n) == pytest.approx(factor)


def test_unknown_collective_and_bad_timings_are_input_errors() -> None:
    with pytest.raises(InputError, match="unknown collective 'gather'"):
        bus_bandwidth_factor("gather", 4)
    with pytest.raises(InputError, match="world size"):
        bus_bandwidth_factor("all_reduce", 0)
    with pytest.raises(InputError, match="positive"):
        algbw_gbps(1024, 0.0)


def test_sizes() -> None:
    assert parse_size("1M") == 1 << 20
    assert parse_size("64KiB") == 64 << 10
    assert parse_size("8") == 8
    assert parse_sizes("1M-8M") == [1 << 20, 2 << 20, 4 << 20, 8 << 20]
    assert parse_sizes("1M-1G:4") == [1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]
    assert parse_sizes("16M,1M,1M") == [1 << 20, 16 << 20]
    assert parse_sizes("1M-3M") == [1 << 20, 2 << 20]
    assert [format_size(s) for s in (8, 1024, 3 << 20, 1 << 30, 1500)] == ["8B", "1K", "3M", "1G", "1500B"]


@pytest.mark.parametrize(("text", "message"), [
    ("1X", "cannot read '1X'"), ("8G-1M", "runs backwards"), ("1M-1G:1", "step factor"), ("", "no message sizes"),
    ("0", "positive"),
])
def test_bad_sizes(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message) as caught:
        parse_sizes(text)
    assert caught.value.where == "--sizes" and caught.value.hint


def test_elements_split_evenly_for_the_splitting_collectives() -> None:
    assert elements_for("all_reduce", 1000, 4, 3) == 250
    assert elements_for("all_gather", 1000, 4, 3) == 249
    assert elements_for("reduce_scatter", 8, 4, 4) == 4  # at least one element per rank
    assert elements_for("broadcast", 2, 4, 4) == 1


def test_summarize() -> None:
    assert summarize([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "mean": 2.0}
    with pytest.raises(InputError):
        summarize([])


def test_pair_rounds_keep_every_node_in_one_transfer_at_a_time() -> None:
    assert pair_rounds(1) == []
    assert pair_rounds(2, "all") == [[(0, 1)], [(1, 0)]]
    assert pair_rounds(2, "ring") == [[(0, 1)], [(1, 0)]]
    for n in (3, 4, 5, 8, 17):
        for mode in ("all", "ring"):
            rounds = pair_rounds(n, mode)
            for links in rounds:
                ends = [node for link in links for node in link]
                assert len(ends) == len(set(ends)), (n, mode, links)
            every = [link for r in rounds for link in r]
            expected = ({(a, b) for a in range(n) for b in range(n) if a != b} if mode == "all"
                        else {(i, (i + 1) % n) for i in range(n)} | {((i + 1) % n, i) for i in range(n)})
            assert sorted(every) == sorted(expected)
    # O(n) rounds for every pair; a bounded number for the ring, whatever the size.
    assert len(pair_rounds(16, "all")) <= 2 * 16 + 2
    assert len(pair_rounds(64, "ring")) <= 6 and len(pair_rounds(65, "ring")) <= 6
    assert pair_rounds(16) == pair_rounds(16, "all") and pair_rounds(17) == pair_rounds(17, "ring")
    with pytest.raises(InputError, match="pairs mode"):
        pair_rounds(3, "star")


def _links(hosts: list[str], mode: str, slow_into: str = "", fast: float = 1.0, slow: float = 0.05) -> dict:
    rounds = pair_rounds(len(hosts), mode)
    return {(hosts[s], hosts[d]): (slow if hosts[d] == slow_into else fast + 0.01 * s)
            for r in rounds for s, d in r}


@pytest.mark.parametrize(("n", "mode"), [(3, "all"), (4, "all"), (5, "all"), (8, "ring"), (30, "ring")])
def test_a_host_with_slow_ingress_is_named_and_no_other(n: int, mode: str) -> None:
    hosts = [f"node{i}" for i in range(1, n + 1)]
    verdict = analyze_links(_links(hosts, mode, slow_into="node2"))
    assert verdict.outlier_hosts == ["node2"]
    assert verdict.hosts[0].direction == "in"
    assert verdict.unexplained == []
    assert all(link.dst == "node2" for link in verdict.slow_links)


def test_uniform_links_name_nobody() -> None:
    verdict = analyze_links(_links([f"n{i}" for i in range(4)], "all"))
    assert verdict.slow_links == [] and verdict.outlier_hosts == []
    assert verdict.threshold_gbps == pytest.approx(0.7 * verdict.median_gbps)


def test_one_slow_link_blames_the_link_not_a_host() -> None:
    links = _links(["a", "b", "c", "d"], "all")
    links[("a", "c")] = 0.1
    verdict = analyze_links(links)
    assert verdict.hosts == []
    assert [(x.src, x.dst) for x in verdict.unexplained] == [("a", "c")]
    assert verdict.outlier_hosts == ["a", "c"]


def test_two_hosts_cannot_tell_which_end() -> None:
    verdict = analyze_links({("a", "b"): 0.2, ("b", "a"): 1.0})
    assert verdict.hosts == [] and verdict.outlier_hosts == ["a", "b"]


def test_link_table_takes_the_best_sample_or_the_median() -> None:
    records = [{"src": "a", "dst": "b", "samples_gbps": [1.0, 5.0, 2.0]}]
    assert link_table(records) == {("a", "b"): 5.0}
    assert link_table(records, "median") == {("a", "b"): 2.0}
    with pytest.raises(InputError, match="without samples"):
        link_table([{"src": "a", "dst": "b", "samples_gbps": []}])


def test_suites_and_the_worker_command() -> None:
    from fstrain.core.bench.arithmetic import parse_suites, worker_argv

    assert parse_suites("all") == ["collectives", "pairs", "compute"]
    assert parse_suites("compute, pairs") == ["pairs", "compute"]
    with pytest.raises(InputError, match="unknown suite gpu in 'gpu,pairs'"):
        parse_suites("gpu,pairs")
    assert worker_argv("python3", suites=["pairs"], json_out="{run_dir}/bench.json", sizes="1M", backend="gloo",
                       extra=["--quick"]) == [
        "python3", "-m", "fstrain.bench", "--suite", "pairs", "--json-out", "{run_dir}/bench.json",
        "--sizes", "1M", "--backend", "gloo", "--quick"]
    assert worker_argv("py", suites=["compute"], json_out="x") == ["py", "-m", "fstrain.bench", "--suite", "compute",
                                                                   "--json-out", "x"]
