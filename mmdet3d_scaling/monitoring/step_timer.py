"""Samples/s and data-wait share of training iterations, from host timestamps only.

The train loop does nothing between the end of one iteration's last hook and the start
of the next iteration but ``next(dataloader)``: that gap is the data wait. Per iteration
this costs a clock read and a ``len()``; no CUDA sync (mmengine's RuntimeInfoHook already
reads the loss back every iteration, so the host clock follows the GPU).
"""
import time
from typing import Any, Callable, Dict, Optional

import torch


def batch_size_of(data_batch: Any) -> Optional[int]:
    """Number of samples in a collated batch, from host-side metadata only (no sync).

    mmdet3d batches are ``dict(inputs=..., data_samples=[...])``; a tensor gives its
    first dimension, a list its length, a dict its first value that has a size.
    """
    if isinstance(data_batch, dict):
        samples = data_batch.get('data_samples')
        if isinstance(samples, (list, tuple)):
            return len(samples)
        if 'inputs' in data_batch:
            return batch_size_of(data_batch['inputs'])
        for value in data_batch.values():
            size = batch_size_of(value)
            if size is not None:
                return size
        return None
    if isinstance(data_batch, torch.Tensor):
        return int(data_batch.shape[0]) if data_batch.dim() > 0 else None
    if isinstance(data_batch, (list, tuple)):
        return len(data_batch)
    return None


class StepTimer:
    """Times a window of training iterations: wall time, data wait, samples.

    Call :meth:`iter_ended` after the last hook of each iteration, :meth:`iter_started`
    at the start of the next, :meth:`count` with each batch, :meth:`pause` /
    :meth:`resume` around validation, :meth:`figures` at a report and :meth:`restart`
    to begin the next window.

    Args:
        clock: seconds on a monotonic clock. Defaults to ``time.perf_counter``.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self._last_end: Optional[float] = None
        self._paused_at: Optional[float] = None
        self.restart()

    def restart(self, start: Optional[float] = None) -> None:
        """Begin a new window at ``start`` (default: now)."""
        self.window_start = self.clock() if start is None else start
        self.excluded_s = 0.0
        self.iters = 0
        self.samples = 0
        self.sized_iters = 0
        self.wait_s = 0.0

    def iter_ended(self, now: Optional[float] = None) -> float:
        """Mark the end of an iteration's hooks (the data wait starts); returns the time."""
        self._last_end = self.clock() if now is None else now
        return self._last_end

    def iter_started(self) -> None:
        """Add the time since the last :meth:`iter_ended` to the data wait."""
        now = self.clock()
        self.wait_s += now - (self._last_end if self._last_end is not None else now)

    def count(self, size: Optional[int]) -> None:
        """One iteration of ``size`` samples (None: the batch size is not known, so the
        window reports no samples/s)."""
        self.iters += 1
        if size is not None:
            self.samples += size
            self.sized_iters += 1

    def pause(self) -> None:
        """Stop counting time (validation inside training is neither wait nor work)."""
        self._paused_at = self.clock()

    def resume(self) -> None:
        """Count time again, leaving out the time since :meth:`pause`."""
        now = self.clock()
        if self._paused_at is not None:
            self.excluded_s += now - self._paused_at
        self._paused_at = None
        self._last_end = now

    def figures(self, now: float) -> Dict[str, float]:
        """``data_wait_share`` and ``samples_per_s`` of the window up to ``now`` (none
        for an empty window; no samples/s when a batch size was not known)."""
        total_s = now - self.window_start - self.excluded_s
        values: Dict[str, float] = {}
        if total_s > 0:
            values['data_wait_share'] = min(self.wait_s / total_s, 1.0)
            if self.sized_iters == self.iters:
                values['samples_per_s'] = self.samples / total_s
        return values
