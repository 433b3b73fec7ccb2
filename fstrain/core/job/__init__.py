"""What `fstrain launch` runs where: the job of each node as values. Pure: the launcher
(fstrain/io/launch.py, fstrain/api/job.py) probes the hosts and asks these modules for the rest.

- :mod:`.plan`: the plan a launch trains with, and the bundled trainer's command line
- :mod:`.spec`: per-node launch commands (torchrun static/c10d, DeepSpeed), env, masking
- :mod:`.nested`: a launcher named inside the launched program (``-- torchrun ...``)
"""
