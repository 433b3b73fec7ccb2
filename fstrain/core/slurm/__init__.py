"""Slurm as values. Pure: the edge (fstrain/io/slurm.py) runs srun, sbatch and scontrol.

- :mod:`.job`: the allocation from ``SLURM_*``, per-node ``srun`` steps, the sbatch script,
  ``scontrol``'s answers
- :mod:`.state`: a Slurm run's state, from Slurm's job state and the run's manifest
"""
