"""Hooks of the measuring tools (one hook a file), not of training runs.

Nothing here is imported by ``mmdet3d_scaling`` or by this package's ``__init__``; each
tool imports the module it needs:

- :mod:`.training_watch`: ``TrainingWatch``, the auto batch size benchmark's check and
  timing after the search (``tools/benchmark_auto_batch_size.py``; importing it
  registers it in mmdet3d's ``HOOKS``).
- :mod:`.stop_after_search`: ``StopAfterSearch``, which measures right after the
  start-up searches and ends ``train()`` there (``tools/analysis/fit_table.py``; not
  registered).
- :mod:`.benchmark_timer_hook`, :mod:`.peak_memory_hook`, :mod:`.profile_hook`,
  :mod:`.progress_file_hook`: the scaling benchmark's timing, peak memory, profiler and
  progress hooks (``tools/benchmark_scaling.py``). Not registered: its worker adds them
  to the runner. They import only the standard library, torch, mmengine and the
  plugin's bottom-layer modules, because the worker also loads them in stock mmdet3d
  runs without importing the plugin
  (:func:`mmdet3d_scaling.diagnostics.scaling_benchmark.worker.plugin_module`).
"""
