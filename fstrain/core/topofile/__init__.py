"""The NCCL topology file (``NCCL_TOPO_FILE``) of a node, generated from what fstrain knows of it.
Pure. Above :mod:`fstrain.core.topo` (the Node, NCCL's XML format) and :mod:`fstrain.core.parsers`
(the probe report, the ``nvidia-smi topo -m`` and ``ibstat`` text), which it builds on.

- :mod:`.ncclxml_gen`: the NCCL topology XML of a node, from its probe report or a topo -m paste
"""
