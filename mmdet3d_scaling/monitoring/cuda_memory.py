"""CUDA memory of one device as torch's caching allocator counts it, with real peaks.

mmengine's LogProcessor reads ``max_memory_allocated`` and then resets the peak counter
every time a LoggerHook formats a line (train and val). :meth:`CudaMemory.fold_peak`,
called just before each such reset, keeps the largest peak seen, so a report gives the
peak since the previous report.
"""
from typing import Dict

import torch

from ..utils import cuda_local_memory

MB = 1024 * 1024


class CudaMemory:
    """Allocated, reserved and peak memory (MiB) of ``device``.

    Args:
        device: the CUDA device of this rank.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak_bytes = 0

    def restart(self) -> None:
        """Forget the peak: the next report's peak starts now."""
        self.peak_bytes = 0

    def fold_peak(self) -> None:
        """Keep the peak counter's value before someone resets it."""
        self.peak_bytes = max(self.peak_bytes,
                              torch.cuda.max_memory_allocated(self.device))

    def figures(self, reset_counter: bool) -> Dict[str, float]:
        """``mem_alloc_mb``, ``mem_reserved_mb``, ``mem_peak_mb`` (MiB) now, and
        ``mem_local_mb``: what the CUDA driver keeps for kernels' local memory, outside
        the allocator (:mod:`mmdet3d_scaling.utils.cuda_local_memory`; left out where
        the driver cannot say).

        Args:
            reset_counter: also reset CUDA's peak counter, so that the next peak is the
                next interval's (when no LoggerHook resets it).
        """
        self.fold_peak()
        if reset_counter:
            torch.cuda.reset_peak_memory_stats(self.device)
        values = {
            'mem_alloc_mb': torch.cuda.memory_allocated(self.device) / MB,
            'mem_reserved_mb': torch.cuda.memory_reserved(self.device) / MB,
            'mem_peak_mb': self.peak_bytes / MB,
        }
        local = cuda_local_memory.kept_bytes(self.device)
        if local is not None:
            values['mem_local_mb'] = local / MB
        return values
