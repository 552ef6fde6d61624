"""Speed, memory and a kernel profile of one config's training step on one GPU.

What ``tools/analysis/benchmark_train_step.py`` measures, for any mmdet3d config (the
plugin's or stock mmdet3d's), at a given micro-batch and precision:

- ``samples_per_s``: samples / wall time of the measured micro-batches after the
  warm-up, synchronised with the GPU only where the window starts and ends, so that
  one iteration's GPU work overlaps the next one's host work as in training (data
  loading between iterations included); with ``sync_each_iter`` every micro-batch is
  synchronised at both ends and the figure is micro-batch size / median time (an
  isolated step: no overlap between iterations);
- ``peak_allocated_gib`` / ``peak_reserved_gib``: the allocator's peaks over the measured
  iterations, with the peak statistics reset after the warm-up, so cuDNN autotune
  workspaces of the first iterations are not counted;
- ``nvml_util_pct``: NVML's GPU utilisation (the share of time a kernel ran, sampled by
  the driver) over the measured micro-batches, with no profiler attached; None without
  ``nvidia-ml-py`` or NVML. It reads higher than the profile's busy share below (87.6 %
  against 79.3 % for BEVFusion on an H100, docs/benchmarks.md): the driver's sampling
  resolution is not documented, the profiler sees every gap;
- ``profile``: the GPU's busy share over the profiled iterations (union of the
  intervals of every kernel, copy and memset, :func:`.step_stages.device_activities`,
  over the wall time), the top kernels by GPU time with their share, and ``stages``:
  where in the step the GPU sits idle (:mod:`.step_stages`); ``trace`` saves the
  profiled iterations' Chrome trace, which ``tools/analysis/trace_busy.py`` reads back;
- ``gc``: Python's garbage collections in the measured micro-batches (count per
  generation, total and longest ms, :class:`.GcPauses`); the profiled window's are in
  ``profile['gc']``, and each is a range ``gc:gen<N>`` in its trace;
- ``sync_sites``: in micro-batches after the profiled ones, each host wait for the GPU
  by stage and Python call site (torch's sync debug mode, :class:`.SyncSiteRecorder`):
  which lines of a stage with many ``syncs`` make them. A window of its own, since the
  recorder's Python work per wait would distort the profile's times.

The run is mmengine's own (``Runner.from_cfg`` or the config's ``runner_type``) with an
iteration-based loop of ``warmup + iters + profile`` micro-batches, accumulation 1, no
validation and no checkpoints.
"""
import gzip
import os
import shutil
import statistics
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

import torch
from mmengine.config import Config
from mmengine.hooks import Hook

from mmdet3d_scaling.diagnostics.gc_pauses import GcPauses
from mmdet3d_scaling.diagnostics.host_reads import SyncSiteRecorder
from mmdet3d_scaling.diagnostics.step_stages import (STEP, StepRange, device_activities,
                                                     labelled_stages, merge, stage_table)
from mmdet3d_scaling.monitoring.nvml_sampler import open_nvml
from mmdet3d_scaling.utils import unwrap_model

GIB = 2 ** 30
SYNC_SITES_LISTED = 40  # (stage, call site) rows kept
PRECISIONS = {'fp32': None, 'bf16': 'bfloat16', 'fp16': 'float16'}


def configure(cfg: Config, batch: int, precision: str, iters: int,
              workers: Optional[int] = None) -> Config:
    """``cfg`` set to train ``iters`` micro-batches of ``batch`` at ``precision``."""
    if precision not in PRECISIONS:
        raise ValueError(f'precision {precision!r} is not one of {", ".join(PRECISIONS)}')
    if batch < 1 or iters < 1:
        raise ValueError(f'batch ({batch}) and iterations ({iters}) must be positive')
    if cfg.get('scaling'):  # the plugin's recipe: one micro-batch per optimizer step
        cfg.scaling = dict(cfg.scaling, total_batch_size=batch, per_gpu_batch_size=batch)
        cfg.scaling.pop('max_per_gpu_batch_size', None)
    cfg.train_dataloader.batch_size = batch
    if workers is not None:
        cfg.train_dataloader.num_workers = workers
        cfg.train_dataloader.persistent_workers = workers > 0
    cfg.optim_wrapper.pop('accumulative_counts', None)
    cfg.pop('optimizer_config', None)
    # Accumulation and batch search change what a micro-batch is; the GPU monitor resets
    # the peak-memory statistics this benchmark reads.
    dropped = ('Cumulative', 'AutoBatchSize', 'GPUMonitor')
    cfg.custom_hooks = [h for h in cfg.get('custom_hooks') or []
                        if not any(name in str(h.get('type')) for name in dropped)]
    cfg.pop('auto_batch_size', None)
    cfg.pop('amp', None)
    cfg.pop('fp16', None)
    dtype = PRECISIONS[precision]
    if dtype is None:
        cfg.optim_wrapper.type = 'OptimWrapper'
        for key in ('dtype', 'loss_scale'):
            cfg.optim_wrapper.pop(key, None)
    else:
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        cfg.optim_wrapper.dtype = dtype
        # bf16 as the plugin's amp key trains it: no GradScaler (whose found_inf read
        # would wait for the GPU at every step)
        cfg.optim_wrapper.loss_scale = ('dynamic' if dtype == 'float16'
                                        else dict(enabled=False))
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=iters, val_interval=10 ** 9)
    cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    cfg.test_cfg = cfg.test_dataloader = cfg.test_evaluator = None
    cfg.param_scheduler = []
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', interval=10 ** 9,
                                        by_epoch=False, save_last=False)
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=10)
    return cfg


def add_gc_hook(cfg: Config, freeze: bool = False,
                interval: Optional[int] = None) -> Optional[dict]:
    """Train ``cfg`` with ``GarbageCollectionHook(freeze, collect_interval=interval)``
    (:mod:`mmdet3d_scaling.hooks.garbage_collection_hook`) in place of any it has; the
    hook's settings, or None where neither is asked for (the config as it is)."""
    if not freeze and interval is None:
        return None
    hook = dict(type='GarbageCollectionHook', freeze=freeze, collect_interval=interval)
    cfg.custom_hooks = [h for h in cfg.get('custom_hooks') or []
                        if 'GarbageCollection' not in str(h.get('type'))] + [hook]
    return hook


def busy_share(intervals: List[Tuple[float, float]], wall_us: float) -> float:
    """Share of ``wall_us`` covered by at least one of ``intervals`` (start, end)."""
    covered = sum(stop - start for start, stop in merge(intervals))
    return covered / wall_us if wall_us > 0 else 0.0


def kernel_summary(prof: Any, iters: int, wall_s: float, top: int = 12) -> Dict[str, Any]:
    """GPU busy share, the top kernels (GPU time per iteration and share of all) and the
    streams that ran kernels; every GPU activity counts (:func:`device_activities`)."""
    activities = device_activities(prof)
    spans = [(a.start, a.stop) for a in activities]
    total_us = sum(a.stop - a.start for a in activities)
    by_name: Dict[str, float] = {}
    for a in activities:
        by_name[a.name] = by_name.get(a.name, 0.0) + a.stop - a.start
    rows = sorted(by_name.items(), key=lambda kv: -kv[1])[:top]
    return dict(
        iterations=iters, wall_ms_per_iter=1e3 * wall_s / iters,
        gpu_busy_share=busy_share(spans, wall_s * 1e6),
        kernel_ms_per_iter=total_us / 1e3 / iters,
        streams=len({a.stream for a in activities}),
        top_kernels=[dict(name=name[:120], ms_per_iter=us / 1e3 / iters,
                          share=us / total_us if total_us else 0.0)
                     for name, us in rows])


def write_trace(prof: Any, path: str) -> None:
    """The profile's Chrome trace (``chrome://tracing``, Perfetto) at ``path``,
    gzip-compressed where ``path`` ends in ``.gz``."""
    if not path.endswith('.gz'):
        prof.export_chrome_trace(path)
        return
    with tempfile.TemporaryDirectory() as tmp:
        plain = os.path.join(tmp, 'trace.json')
        prof.export_chrome_trace(plain)
        with open(plain, 'rb') as src, gzip.open(path, 'wb') as dst:
            shutil.copyfileobj(src, dst)


class TrainStepProbe(Hook):
    """Times micro-batches, reads peak memory after the warm-up, profiles the last ones.

    Args:
        warmup (int): micro-batches before the measurement (cuDNN autotune, allocator
            growth); peak statistics are reset when they end.
        iters (int): measured micro-batches.
        profile (int): micro-batches profiled after the measured ones (0: none).
        batch (int): samples per micro-batch.
        sync_each_iter (bool): synchronise with the GPU before and after every
            micro-batch (isolated steps). Default False: only at the ends of the
            measured and the profiled window, as training runs.
        sync_sites (int): micro-batches after the profiled ones in which host waits
            are counted by stage and call site. Default 0: none.
        trace (str, optional): write the profiled micro-batches' Chrome trace here
            (gzip-compressed where the name ends in ``.gz``). Default None: none.
    """

    priority = 'VERY_LOW'

    def __init__(self, warmup: int, iters: int, profile: int, batch: int,
                 sync_each_iter: bool = False, sync_sites: int = 0,
                 trace: Optional[str] = None) -> None:
        self.warmup, self.iters, self.profile, self.batch = warmup, iters, profile, batch
        self.sync_each_iter = sync_each_iter
        self.sync_sites = sync_sites
        self.trace = trace
        self.sites: Optional[list] = None
        self._recorder: Optional[SyncSiteRecorder] = None
        self._site_stages = None
        self._open = None
        self.times: List[float] = []
        self.window_s = 0.0
        self.peaks: Tuple[int, int] = (0, 0)
        self.summary: Optional[Dict[str, Any]] = None
        self._t = 0.0
        self._window_t = 0.0
        self._prof = None
        self._prof_t = 0.0
        self._stages = None
        self._step = StepRange()
        self._nvml = None
        self.nvml_util_pct: Optional[float] = None
        self._gc: Optional[GcPauses] = None  # open in the measured window
        self._prof_gc: Optional[GcPauses] = None  # open in the profiled window
        self.gc: Optional[Dict[str, Any]] = None

    def _window_edge(self, it: int) -> bool:
        """Whether iteration ``it`` (0-based) starts the measured or the profiled window."""
        return it in (self.warmup, self.warmup + self.iters)

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        """Start the clock (and the profiler for the profiled micro-batches)."""
        if self.sync_each_iter or self._window_edge(runner.iter):
            torch.cuda.synchronize()
        if runner.iter == self.warmup + self.iters and self.profile:
            from torch.profiler import ProfilerActivity, profile
            self._prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            self._prof.__enter__()
            self._stages = labelled_stages(unwrap_model(runner.model), runner.optim_wrapper)
            self._stages.__enter__()
            self._prof_gc = GcPauses(mark_in_profile=True).__enter__()
            self._prof_t = time.perf_counter()
        if runner.iter == self.warmup + self.iters + self.profile and self.sync_sites:
            self._start_sync_sites(runner)
        if self._recorder is not None:
            self._open.open.append(STEP)  # the step's own glue: '(step, unlabelled)'
        if runner.iter == self.warmup:
            # its first read drops the warm-up's samples; None (said once) without NVML
            self._nvml = open_nvml(torch.device('cuda', torch.cuda.current_device()))
            self._gc = GcPauses().__enter__()
            self._window_t = time.perf_counter()
        if self._prof is not None:
            self._step.open()
        self._t = time.perf_counter()

    def after_train_iter(self, runner, batch_idx: int, data_batch=None,
                         outputs=None) -> None:
        """Stop the clock; reset the peaks after the warm-up; end the profile."""
        done = runner.iter + 1  # mmengine counts this iteration after the hooks
        ends = (self.warmup, self.warmup + self.iters, self.warmup + self.iters + self.profile)
        if self.sync_each_iter or done in ends:
            torch.cuda.synchronize()
        self._step.close()
        if self._recorder is not None:
            self._open.open.pop()
        if self.warmup < done <= self.warmup + self.iters:
            self.times.append(time.perf_counter() - self._t)
        if done == self.warmup:
            torch.cuda.reset_peak_memory_stats()
        if done == self.warmup + self.iters:
            self.window_s = time.perf_counter() - self._window_t
            self._gc.__exit__(None, None, None)
            self.gc, self._gc = self._gc.figures(self.iters), None
            self.peaks = (torch.cuda.max_memory_allocated(),
                          torch.cuda.max_memory_reserved())
            if self._nvml is not None:
                self.nvml_util_pct = self._nvml.read().get('util_pct')
                self._nvml.close()
                self._nvml = None
        if self._prof is not None and done == self.warmup + self.iters + self.profile:
            wall = time.perf_counter() - self._prof_t
            self._prof_gc.__exit__(None, None, None)
            self._stages.__exit__(None, None, None)
            self._prof.__exit__(None, None, None)
            if self.trace:
                write_trace(self._prof, self.trace)
            self.summary = kernel_summary(self._prof, self.profile, wall)
            self.summary['stages'] = stage_table(self._prof)
            self.summary['gc'] = self._prof_gc.figures(self.profile)
            self._prof = self._stages = self._prof_gc = None
        if self._recorder is not None and done == self.last_iteration:
            self._end_sync_sites()

    def _start_sync_sites(self, runner) -> None:
        """Label the stages and count each host wait by stage and call site."""
        self._site_stages = labelled_stages(unwrap_model(runner.model), runner.optim_wrapper)
        self._open = self._site_stages.__enter__()
        self._recorder = SyncSiteRecorder(stage=self._open.current)
        self._recorder.__enter__()

    def _end_sync_sites(self) -> None:
        self._recorder.__exit__(None, None, None)
        self._site_stages.__exit__(None, None, None)
        self.sites = self._recorder.sites(self.sync_sites, top=SYNC_SITES_LISTED)
        self._recorder = self._site_stages = self._open = None

    @property
    def last_iteration(self) -> int:
        """The number of micro-batches the probe needs."""
        return self.warmup + self.iters + self.profile + self.sync_sites

    def figures(self) -> Dict[str, Any]:
        """The run's figures (see the module docstring)."""
        median = statistics.median(self.times) if self.times else float('nan')
        if not self.times:
            rate = None
        elif self.sync_each_iter:
            rate = self.batch / median
        else:
            rate = self.batch * len(self.times) / self.window_s
        return dict(batch=self.batch, warmup=self.warmup, measured=len(self.times),
                    sync_each_iter=self.sync_each_iter,
                    median_s_per_micro_batch=median, samples_per_s=rate,
                    peak_allocated_gib=self.peaks[0] / GIB,
                    peak_reserved_gib=self.peaks[1] / GIB,
                    nvml_util_pct=self.nvml_util_pct, gc=self.gc, profile=self.summary,
                    sync_sites=self.sites)
