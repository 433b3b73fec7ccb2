"""A run's records and state, as values. Pure: fstrain/io/runs.py reads and writes the files.

- :mod:`.runrecord`: this machine's records of a run (index entry, detached.json, keeper.json)
- :mod:`.runstate`: a run's state (starting ... lost) from its nodes' records
"""
