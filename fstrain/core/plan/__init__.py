"""The planner: what a training configuration needs per GPU and how fast it runs, and the search
that ranks configurations. Pure: values in, values out (no files, network, processes or GPUs).

- values: ``schema`` (ModelSpec, PlanKnobs, ClusterSummary and the names each knob accepts);
- inputs: ``recipe`` (a recipe mapping -> model spec and training defaults; ``hfconfig`` reads a
  Hugging Face ``config.json`` mapping), ``modelsize`` (parameters by part), ``gpus`` (the GPU
  table), ``plancluster`` (nodes and links), ``assumptions`` (every assumed number, with its reason);
- what runs: ``precision`` (dtypes per mode), ``acpolicy`` (activation checkpointing policies),
  ``losses``, ``kernels`` (torch.compile, fused RMSNorm), ``pipeline`` (schedules),
  ``contextparallel`` (ring attention), ``adafactor``, ``buckets`` (DeepSpeed/FSDP bucket sizes);
- models: ``memory`` (per-GPU bytes at each moment of a step), ``timemodel`` (step time),
  ``gemmshapes`` (the GEMMs a block runs, by shape), ``gemmcurve`` (measured GEMM rates by shape);
- ``planner`` (the search and the plan file);
- output: ``planfile`` (``plan.yaml``: the values the renderers, the launcher and the trainer read).

``--calibrate`` (measured numbers -> assumptions) is :mod:`fstrain.core.calibrate`, above this
package: it reads the bench's and the report's documents, which build on the planner.
"""
