"""Topology: a node's GPUs, NICs and links as values, and NCCL's topology XML. Pure.

- :mod:`.topology`: Node, Gpu, Nic, the link matrix, NUMA and NVLink domains
- :mod:`.probe_report`: the probe's JSON report, validated and read as a Node
- :mod:`.ncclxml`: NCCL topology XML read as NCCL reads it, written as NCCL writes it
- :mod:`.ncclxml_gen`: the NCCL topology XML of a node, from its probe report or a topo -m paste

The tool parsers these build on are in :mod:`fstrain.core.parsers`.
"""
