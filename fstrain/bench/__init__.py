"""Benchmarks that run on the hosts (imports torch; the CLI never imports it at start-up).

Public surface:

- :func:`fstrain.bench.compute.matmul_tflops` and :func:`fstrain.bench.compute.memory_bandwidth_gbps`:
  one device's dense matmul TFLOPS and copy bandwidth, every sample in a plain dict;
- :func:`fstrain.bench.collectives.time_collective`: one collective at one message size over a
  process group, with nccl-tests' algorithm and bus bandwidth;
- :func:`fstrain.bench.pairs.time_pairs`: node-to-node bandwidth of every directed link;
- ``python -m fstrain.bench --suite compute|collectives|pairs|all --json-out FILE``: the worker
  (:mod:`fstrain.bench.worker`), standalone or under torchrun.

The arithmetic (bus bandwidth factors, sizes, outliers) is pure and lives in
:mod:`fstrain.core.bench.arithmetic` and :mod:`fstrain.core.bench.pairs`.
"""
