"""``workbench calibrate``: measure the simulator's cost model on this GPU and write the file
the simulator reads (``data/calibration/<gpu>.json``), each field with how it was measured.

Two halves, so that fitting can be re-run without a GPU (``--raw`` / ``--from-raw``):

* **measure** (GPU, ``measure.measure``), in this order in one process: (1) the ``cuda``
  executor decodes the calibration models under the strategies whose costs the simulator needs
  (``specs.CALIBRATION_STRATEGIES``), every host op timed with the host clock, *before CUPTI is
  first enabled* (a CUDA graph instantiated once CUPTI has been active stays instrumented;
  ``runs``); (2) probe kernels (``probes``: device-to-device copy, a streaming read at growing
  grid sizes for latency x bytes in flight, an FMA loop, empty-kernel chains under graph
  replay, a PDL chain of spin kernels, pinned and pageable copies, three small grids on three
  streams); (3) the same executor runs traced with CUPTI (per-node kernel durations, API
  periods, PDL boundaries, graph capture and instantiation), reduced to the raw tables by
  ``tables``.
* **fit** (pure, ``fit.fit``): raw numbers -> calibration. Host costs are the untraced periods
  of each host op (op start to the next op's start: what the host thread really spends, Python
  included); device latencies and waits come from CUPTI; kernel costs are least-squares fits
  (``kernel_fit``), in absolute error (``kernel_fit.fit_kernels`` says why), of
  ``fixed_ns + work_scale x roofline`` to the graph-replay durations of the calibration
  models' kernels less the per-kernel time CUPTI's timestamps add (traced minus untraced graph
  replays): one per ggml op measured (and per executor kernel where an op ran on several), one
  per kernel family as the fallback for ops not measured; PDL's overlap is measured per kernel
  boundary (graphs vs graphs + PDL) and summarised by the global parameters the simulator
  reads. ``check.calibration_run_errors`` (``--check``) predicts the calibration runs with the
  result.

By default Llama, qwen3 MoE and qwen3-next shapes are measured (``specs.CALIBRATION_MODELS``;
``--models`` picks others): qwen3 dense and gpt-oss stay held out, so the fidelity report
(``benchmarks/sim_fidelity.py``) shows the error on families the fit has not seen. Besides the
unfused runs, one run with every fusion gives the fused kernels their own fits, and the same
with PDL signalling at each kernel's start gives each fit its ``early_scale`` (how much slower
a kernel runs when PDL launches it while its predecessor's main loop still runs).

The command (``workbench calibrate``) is ``workbench/commands/calibrate.py``.
"""
