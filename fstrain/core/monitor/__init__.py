"""Watching a running job: what its ranks and launchers print, and what its nodes report. Pure: the
edge (fstrain/io/launch.py, fstrain/io/logs.py, fstrain/io/remote) reads the output.

- :mod:`.logtail`: log files by whole lines and byte offsets, forward or from the end
- :mod:`.metricline`: the metric line a rank prints per step, and metrics.jsonl; a rank's step
  from a line of its output (``read_step``: the metric line, else the trainer's progress line),
  and its latest numbers across its lines (``newer_step``)
- :mod:`.noise`: what of a launcher's own output reaches the terminal
- :mod:`.rankexit`: the failed rank and its own exit code, from the launchers' output
- :mod:`.stacks`: hang analysis: stack dumps -> where each rank is, the odd ranks
- :mod:`.promfile`: a node's ranks, and the time and end of the node's job, as a Prometheus textfile
- :mod:`.gpuusage`: GPU memory and utilisation of a run's nodes (`fstrain status`)
- :mod:`.watch`: the live view's rows (`fstrain status --watch`)
- :mod:`.stragglers`: which ranks are stragglers, the one rule of the live view and `fstrain report`

``rankexit``, ``stacks``, ``logtail``, ``metricline`` and ``promfile`` also run on the nodes: the
edge sends their source text with the scripts of fstrain/io/remote, so they import nothing but the
standard library (tests/unit/test_core_purity.py holds them to it).
"""
