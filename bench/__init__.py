"""geoserve's benchmarks: run each from the repository root as ``python -m bench.NAME``.

- ``bench.engine``: engine overhead, end to end against the bare model;
- ``bench.pipeline``: pre-processing rate, peak memory against scene size, TerraTorch side by
  side (and ``bench.engine`` again, so the figures come from one run);
- ``bench.prithvi``: Prithvi encoder throughput per variant, the engine's model step;
- ``bench.server``: ``geoserve serve`` under load, cross-request batching on and off;
- ``bench.many_models``: one three-model server against three one-model servers, one mixed load;
- ``bench.shared_weights``: three fine-tunes of one encoder loaded side by side, shared and not;
- ``bench.cpu_backends``: torch and OpenVINO at fp32, bf16 and int8 on the CPU, side by side;
- ``bench.trust``: load, a memory soak and costly small uploads against one source tree;
- ``bench.host``: the host pipeline alone (no-op model) against GDAL decoding, 1 and 2 threads;
- ``bench.generation``: served TerraMind generation (tiny at real size): throughput, step
  batching across requests, seams at patch borders (``--quick``: the toy model; ``--gpu``);
- ``bench.gpu``: a whole Sentinel-2-sized scene on one CUDA GPU, phase by phase; with
  ``bench.gpu_checks`` (CUDA correctness), ``bench.gpu_image`` (the GPU image's package list and
  the wheels it lacks), ``bench/gpu_prepare.sh`` (run here) and ``bench/gpu_run.sh`` (run there).

``bench.engine``, ``bench.pipeline``, ``bench.prithvi``, ``bench.server``, ``bench.host`` and
``bench.generation`` write their JSON to ``bench/results/`` and rewrite their own section of
docs/benchmarks.md (``--no-docs`` leaves it alone); ``bench.trust`` prints one JSON object and
writes it to ``--out``; ``bench.gpu`` writes ``gpu.json`` into ``--out-dir`` (default ``$OUT``)
after every phase.
Shared code: ``bench.harness`` (timing, memory, the machine line, results and docs),
``bench.scenes`` (inputs) and ``bench.models`` (the benchmark models).
"""
