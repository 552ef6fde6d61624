"""Diagnostics: where a training run's time goes, and how it scales.

Not imported by ``mmdet3d_scaling`` itself (nothing here is registered); tools and
tests import the modules they need:

- :mod:`.profiling`: summaries of a ``torch.profiler`` run (host synchronisations,
  collective time, GPU kernel time, top operators, call sites of waits and launches).
- :mod:`.host_reads`: :class:`~.host_reads.HostReadCensus` (the calls that would read GPU
  values back, counted by Python call site, on a CPU too) and
  :class:`~.host_reads.SyncSiteRecorder` (the synchronisations a CUDA run makes).
- :mod:`.launch_census`: :class:`~.launch_census.LaunchCensus`, kernel-running operators
  and copies by Python call site.
- :mod:`.scaling_benchmark`: the scaling benchmark of ``tools/benchmark_scaling.py``
  (timed runs on 1..N GPUs, their figures, tables and charts; ``tracking`` counts the
  planned runs for the progress bar).
- :mod:`.parity` (with :mod:`.parity_cli`): the same recipe in several process /
  accumulation arrangements, to final metrics with seed spreads
  (``tools/benchmark_parity.py``).
- :mod:`.step_stages`, :mod:`.train_step_benchmark`: one config's training step by stage
  (``tools/analysis/benchmark_train_step.py``); :mod:`.batch_size_benchmark` and
  :mod:`.batch_size_limits`, :mod:`.bev_pool_benchmark`, :mod:`.view_transform_benchmark`,
  :mod:`.bevfusion_lidar_benchmark`, :mod:`.gpu_monitor_benchmark`: the other tools'
  measurements; :mod:`.fit_table`: the fastest fit's choice per memory budget
  (``tools/analysis/fit_table.py``); :mod:`.hooks`: the tools' hooks, one a file.

The progress-bar policy of the long tools is :mod:`mmdet3d_scaling.utils.progress`.
"""
