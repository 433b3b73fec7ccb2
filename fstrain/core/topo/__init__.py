"""Topology: a node's GPUs, NICs and links as values, and NCCL's topology XML. Pure.

- :mod:`.topology`: Node, Gpu, Nic, the link matrix, NUMA and NVLink domains
- :mod:`.ncclxml`: NCCL topology XML read as NCCL reads it, written as NCCL writes it

The parsers that build a Node from tool text and from the probe report are in
:mod:`fstrain.core.parsers`, above this package; the NCCL topology XML generated for a node is in
:mod:`fstrain.core.topofile`, above both.
"""
