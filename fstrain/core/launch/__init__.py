"""Launch and runs: what `fstrain launch` starts on each node, and what a run's output and state
mean. Pure: the edge (fstrain/io/launch.py, fstrain/io/runs.py, fstrain/io/logs.py) does the I/O.

- :mod:`.plan`: the plan a launch trains with, and the bundled trainer's command line
- :mod:`.spec`: per-node launch commands (torchrun static/c10d, DeepSpeed), env, masking
- :mod:`.nested`: a launcher named inside the launched program (``-- torchrun ...``)
- :mod:`.noise`: what of a launcher's own output reaches the terminal
- :mod:`.rankexit`: the failed rank and its own exit code, from the launchers' output
- :mod:`.stacks`: hang analysis: stack dumps -> where each rank is, the odd ranks
- :mod:`.supervisor`: the supervision rules: events in, decisions and the run's verdict out
- :mod:`.runstate`: a run's state (starting ... lost) from its nodes' records
- :mod:`.metricline`: the metric line a rank prints per step, and metrics.jsonl; a rank's step
  from a line of its output (``read_step``: the metric line, else the trainer's progress line)
- :mod:`.promfile`: a node's ranks as a Prometheus textfile
- :mod:`.runrecord`: this machine's records of a run (index entry, detached.json)
- :mod:`.logtail`: log files by whole lines and byte offsets, forward or from the end
- :mod:`.gpuusage`: GPU memory and utilisation of a run's nodes (`fstrain status`)
- :mod:`.duration`: durations on the command line (``20s``, ``5m``, ``1.5h``)
- :mod:`.recovery`: the recovery policy: what follows a failed attempt, each attempt's record

``rankexit``, ``stacks``, ``supervisor``, ``logtail``, ``metricline`` and ``promfile`` also run
on the nodes: the edge sends their source text with the scripts of fstrain/io/remote, so they
import nothing but the standard library (tests/unit/test_core_purity.py holds them to it).
"""
