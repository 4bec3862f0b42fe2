"""geoserve's benchmarks: run each from the repository root as ``python -m bench.NAME``.

- ``bench.engine``: engine overhead, end to end against the bare model;
- ``bench.pipeline``: pre-processing rate, peak memory against scene size, TerraTorch side by
  side (and ``bench.engine`` again, so the figures come from one run);
- ``bench.prithvi``: Prithvi encoder throughput per variant, the engine's model step;
- ``bench.server``: ``geoserve serve`` under load, cross-request batching on and off;
- ``bench.trust``: load, a memory soak and costly small uploads against one source tree;
- ``bench.gpu``: a whole Sentinel-2-sized scene on one CUDA GPU.

``bench.engine``, ``bench.pipeline``, ``bench.prithvi`` and ``bench.server`` write their JSON to
``bench/results/`` and rewrite their own section of docs/benchmarks.md (``--no-docs`` leaves it
alone); ``bench.trust`` and ``bench.gpu`` print one JSON object and write it to ``--out``.
Shared code: ``bench.harness`` (timing, memory, the machine line, results and docs),
``bench.scenes`` (inputs) and ``bench.models`` (the benchmark models).
"""
