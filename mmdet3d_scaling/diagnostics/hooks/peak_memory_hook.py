"""PeakMemoryHook: the scaling benchmark's CUDA peak, kept across LoggerHook resets."""
from typing import Any

import torch
from mmengine.hooks import Hook

from .benchmark_timer_hook import BenchmarkTimerHook


class PeakMemoryHook(Hook):
    """Reads the CUDA peak before mmengine's LoggerHook resets it at each log interval.

    Not registered: the benchmark's worker adds it next to its timer. Priority
    ``VERY_HIGH``: its ``after_train_iter`` runs before the LoggerHook's
    (``BELOW_NORMAL``).

    Args:
        timer (BenchmarkTimerHook): the run's timer, whose ``peak_mb`` (MiB) it raises.
    """

    priority = 'VERY_HIGH'

    def __init__(self, timer: BenchmarkTimerHook) -> None:
        self.timer = timer

    def after_train_iter(self, runner, batch_idx: int, data_batch: Any = None,
                         outputs: Any = None) -> None:
        """Inside the measured window on CUDA: raise the timer's peak to the counter's."""
        if self.timer.cuda and runner.iter >= self.timer.measure_from:
            self.timer.peak_mb = max(self.timer.peak_mb,
                                     torch.cuda.max_memory_allocated() / 2**20)
