"""What :class:`~mmdet3d_scaling.hooks.gpu_monitor_hook.GPUMonitorHook` measures, one
collaborator a job, each usable and testable without the hook or a Runner:

- :mod:`.step_timer`: samples/s and the share of time spent waiting for data, from host
  timestamps (:class:`~.step_timer.StepTimer`, :func:`~.step_timer.batch_size_of`);
- :mod:`.cuda_memory`: allocated / reserved / peak CUDA memory with peaks kept across
  mmengine's counter resets (:class:`~.cuda_memory.CudaMemory`);
- :mod:`.nvml_sampler`: utilisation, device memory, power and temperature from NVML
  (:class:`~.nvml_sampler.NvmlSampler`, :func:`~.nvml_sampler.open_nvml`);
- :mod:`.amp_skips`: optimizer steps a GradScaler skipped (:class:`~.amp_skips.AmpSkips`);
- :mod:`.rank_summary`: min / max of a few figures over the ranks with one all_gather
  (:func:`~.rank_summary.across_ranks`, :func:`~.rank_summary.spread`).
"""
