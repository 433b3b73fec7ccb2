"""Supervision of a launched run: the rules that drive it, who is to blame when an attempt fails,
and what follows. Pure: the edge (fstrain/io/launch.py, fstrain/io/remote/coordinator.py) and the
run driver (fstrain/api/driver.py) feed the events and carry out the decisions.

- :mod:`.supervisor`: the supervision rules: events in, decisions and the run's verdict out
- :mod:`.blame`: who is at fault for a failed attempt: evidence in, a verdict out
- :mod:`.recovery`: the recovery policy: what follows a failed attempt, each attempt's record
- :mod:`.duration`: durations on the command line (``20s``, ``5m``, ``1.5h``): the supervisor's
  stall and finish timeouts, and the ages `fstrain logs --since` and `gc --older-than` take

``supervisor`` also runs on the nodes (node 0 of a detached run): the edge sends its source text
with the scripts of fstrain/io/remote, so it imports nothing but the standard library
(tests/unit/test_core_purity.py holds it to it). What the rules read a run's output with is in
:mod:`fstrain.core.monitor`, below this package.
"""
