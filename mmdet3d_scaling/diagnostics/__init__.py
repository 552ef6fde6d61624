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
- :mod:`.progress`: the one progress-bar policy of the long tools (stderr only; quiet
  under ``--no-progress``, ``MMDET3D_SCALING_NO_PROGRESS=1``, a non-TTY stderr or a rank
  > 0); also used by :mod:`mmdet3d_scaling.batch_size.search`.
- :mod:`.parity`: the same recipe in several process / accumulation arrangements, to
  final metrics with seed spreads (``tools/benchmark_parity.py``).
"""
