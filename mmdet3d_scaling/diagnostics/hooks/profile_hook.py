"""ProfileHook: ``torch.profiler`` over the scaling benchmark's measured window."""
import os
import time
from typing import Any, Optional

import torch
from mmengine.hooks import Hook

from .benchmark_timer_hook import BenchmarkTimerHook


class ProfileHook(Hook):
    """Runs ``torch.profiler`` over the measured window of a profiling run and hands the
    per-iteration summary (:func:`mmdet3d_scaling.diagnostics.profiling.summarize_profile`:
    host synchronisations, collective time, top operators) to the timer.

    Not registered: the benchmark's worker adds it to profiling runs. Priority
    ``VERY_LOW``.

    Args:
        timer (BenchmarkTimerHook): the run's timer (knows the window).
        trace_dir (str, optional): where each rank writes a Chrome trace. Defaults to
            None (no trace).
    """

    priority = 'VERY_LOW'

    def __init__(self, timer: BenchmarkTimerHook, trace_dir: Optional[str] = None) -> None:
        self.timer = timer
        self.trace_dir = trace_dir
        self._prof: Any = None
        self._syncs: Any = None
        self._t0 = 0.0

    def before_train_iter(self, runner, batch_idx: int, data_batch: Any = None) -> None:
        """At the measured window's first iteration: start the profiler (and, on CUDA,
        the recorder of synchronisation call sites)."""
        if runner.iter != self.timer.measure_from:
            return
        from torch.profiler import ProfilerActivity, profile

        from ..host_reads import SyncSiteRecorder
        activities = [ProfilerActivity.CPU]
        if self.timer.cuda:
            activities.append(ProfilerActivity.CUDA)
        # with_stack: Python frames as parent events, so host waits get call sites
        self._prof = profile(activities=activities, with_stack=True)
        # on CUDA the call sites come from torch's sync debug mode (see SyncSiteRecorder)
        self._syncs = SyncSiteRecorder() if self.timer.cuda else None
        if self._syncs is not None:
            self._syncs.__enter__()
        self._prof.start()
        self._t0 = time.perf_counter()

    def after_train_iter(self, runner, batch_idx: int, data_batch: Any = None,
                         outputs: Any = None) -> None:
        """At the run's last iteration: stop the profiler, summarise it into the timer
        and write the Chrome trace (with ``trace_dir``)."""
        if self._prof is None or runner.iter + 1 != runner.train_loop.max_iters:
            return
        if self.timer.cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - self._t0
        self._prof.stop()
        iters = runner.iter + 1 - self.timer.measure_from
        sites = None  # on CUDA: the recorder's, else the profiler's own
        if self._syncs is not None:
            self._syncs.__exit__(None, None, None)
            sites, self._syncs = self._syncs.sites(iters), None
        from ..profiling import summarize_profile
        self.timer.profile = summarize_profile(self._prof, iters, wall)
        if sites is not None:
            self.timer.profile['sync_sites'] = sites
        if self.trace_dir:
            from mmengine.dist import get_rank
            os.makedirs(self.trace_dir, exist_ok=True)
            self._prof.export_chrome_trace(
                os.path.join(self.trace_dir, f'trace_rank{get_rank()}.json'))
        self._prof = None
