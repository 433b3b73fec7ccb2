"""Pure parsers for captured tool output: each takes text and returns values, never runs anything.

- :mod:`.topo_matrix`: ``nvidia-smi topo -m`` (and ``-mp``, ``--matrix``)
- :mod:`.query_gpu`: ``nvidia-smi --query-gpu=... --format=csv``
- :mod:`.ibstat`: ``ibstat``, ``ibstatus`` and ``ibv_devinfo``
- :mod:`.nvidia_smi_q`: ``nvidia-smi -q``
- :mod:`.probe_report`: the probe's JSON report, validated (its tool text read with the parsers
  above) and read as a Node

They build on the topology model, :mod:`fstrain.core.topo`.
"""
