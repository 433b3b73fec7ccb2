"""fstrain: launcher and orchestrator for multi-node GPU training.

The package is split in three layers (see docs/architecture.md):

- ``fstrain.core``: pure values and arithmetic (parsers, inventory, topology, planner,
  renderers). No network, processes, GPUs, torch or rich.
- ``fstrain.io``: the edge that touches the world (SSH and local transports, fan-out,
  probes, launch). Everything there takes its transport as an argument.
- ``fstrain.cli``: the typer application, thin.
"""

__version__ = "0.1.0"
