"""Find the largest per-device batch that trains without running out of memory.

A trial is ``steps_per_trial`` real training steps on one batch built from the
dataset's largest samples (:mod:`.samples`), in the frame of :mod:`.trial` (state
restored, device limited to ``(1 - margin)`` of its capacity). The search doubles the
batch from ``init_batch_size`` until a trial fails, then bisects between the last
success and the first failure. A trial fails when it runs out of memory under that
limit (or reports a peak above it); ranks then agree on the minimum.

Rank 0 shows a progress bar of the trials (phase, batch size; an ETA once the
bisection's length is known) under :mod:`mmdet3d_scaling.utils.progress`'s policy.
"""
import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, List, Optional

from mmengine import dist
from mmengine.logging import print_log
from mmengine.optim import OptimWrapper
from torch import nn

from ..utils import progress
from .memory_probe import MemoryProbe
from .trial import ResultRecord, TrialSearch, agree_min, format_bytes


# ----------------------------------------------------------------------------- results
@dataclass
class Trial:
    """One trial: ``fits`` is False on OOM or when ``peak_bytes`` exceeds the limit."""
    batch_size: int
    fits: bool
    peak_bytes: Optional[int]
    oom: bool
    seconds: float


@dataclass
class SearchResult(ResultRecord):
    """Outcome of a search (this rank's, or agreed across ranks in ``batch_size``).

    ``batch_size`` is what to train with; ``local_batch_size`` is this rank's own
    finding; ``hit_upper_bound`` means every batch up to ``max_batch_size`` fit.
    """
    batch_size: int
    local_batch_size: int
    capacity_bytes: int
    limit_bytes: int
    margin: float
    max_batch_size: int
    hit_upper_bound: bool
    device_name: str
    seconds: float
    trials: List[Trial] = field(default_factory=list)
    from_cache: bool = False
    trial_type = Trial  # a class attribute, not a field: what the trials are


# ------------------------------------------------------------------------ the search
class BatchSizeFinder(TrialSearch):
    """Largest batch whose training steps run in ``(1 - margin)`` of device memory.

    Args:
        model, optim_wrapper, make_batch, probe: as :class:`~.trial.TrialSearch`.
        margin: share of device memory kept free, in [0, 1): trials run with the device
            limited to ``(1 - margin)`` of its capacity. Defaults to 0.1.
        steps_per_trial: training steps per trial (the first allocates the optimizer
            state, later ones show the allocator's steady state). Defaults to 2.
        init_batch_size: first batch tried. Defaults to 1.
        max_batch_size: largest batch tried. Defaults to 256.
        new_batch_each_step: call ``make_batch`` for every step of a trial (e.g. random
            batches, whose varying shapes fragment the allocator's cache as training
            does) instead of once per trial. Defaults to False.
        progress_desc: label of the trials' progress bar. Defaults to
            'batch size search'.
    """

    def __init__(self, model: nn.Module, optim_wrapper: OptimWrapper,
                 make_batch: Callable[[int], Any], probe: MemoryProbe,
                 margin: float = 0.1, steps_per_trial: int = 2,
                 init_batch_size: int = 1, max_batch_size: int = 256,
                 new_batch_each_step: bool = False,
                 progress_desc: str = 'batch size search'):
        super().__init__(model, optim_wrapper, make_batch, probe, margin)
        if steps_per_trial < 1:
            raise ValueError(f'steps_per_trial must be >= 1, got {steps_per_trial}')
        if not 1 <= init_batch_size <= max_batch_size:
            raise ValueError(
                f'need 1 <= init_batch_size <= max_batch_size, got init_batch_size='
                f'{init_batch_size}, max_batch_size={max_batch_size}')
        self.steps_per_trial = int(steps_per_trial)
        self.init_batch_size = int(init_batch_size)
        self.max_batch_size = int(max_batch_size)
        self.new_batch_each_step = bool(new_batch_each_step)
        self.progress_desc = progress_desc
        self.trials: List[Trial] = []
        self._bar = progress.bar(show=False)  # replaced while a search runs

    @contextlib.contextmanager
    def _progress(self) -> Iterator[None]:
        """A bar of the trials for one search (rank 0's; total known when bisecting)."""
        self._bar = progress.bar(desc=self.progress_desc, unit='trial',
                                 show=dist.get_rank() == 0)
        try:
            yield
        finally:
            self._bar.close()
            self._bar = progress.bar(show=False)

    def _trial(self, batch_size: int, phase: str,
               left_after: Optional[int] = None) -> bool:
        """``try_batch`` with the bar showing the phase and batch; ``left_after``: the
        trials that follow at most (None: not known yet)."""
        bar = self._bar
        if left_after is not None:
            bar.total = bar.n + 1 + left_after
        bar.set_postfix_str(f'{phase}, batch={batch_size}')
        fits = self.try_batch(batch_size).fits
        bar.update(1)
        return fits

    def _steps(self, batch_size: int) -> int:
        """One trial's steps at ``batch_size``; the peak bytes they held."""
        data = self.make_batch(batch_size)
        for step in range(self.steps_per_trial):
            if step and self.new_batch_each_step:
                data = self.make_batch(batch_size)
            self.model.train_step(data, optim_wrapper=self.optim_wrapper)
        return self.probe.peak_bytes()

    def try_batch(self, batch_size: int) -> Trial:
        """Run one trial at ``batch_size`` (inside :meth:`session`)."""
        start = time.perf_counter()
        peak = self.run_trial(lambda: self._steps(batch_size))
        oom = peak is None
        fits = not oom and peak <= self.limit_bytes
        trial = Trial(batch_size, fits, peak, oom, time.perf_counter() - start)
        self.trials.append(trial)
        with progress.writing():  # the bar leaves the terminal line for the log line
            print_log(f'auto batch size: batch {batch_size} '
                      f'{"fits" if fits else "does not fit"} '
                      f'({"OOM" if oom else format_bytes(peak)} of '
                      f'{format_bytes(self.limit_bytes)} allowed)', logger='current')
        return trial

    def _largest_fitting(self) -> int:
        good, bad = 0, None
        size = self.init_batch_size
        while True:  # grow by powers of two
            if self._trial(size, 'doubling'):
                good = size
                if size == self.max_batch_size:
                    return good
                size = min(size * 2, self.max_batch_size)
            else:
                bad = size
                break
        return self._bisect(good, bad)

    def _bisect(self, good: int, bad: int) -> int:
        """Largest fitting batch between a success ``good`` and a failure ``bad``."""
        while bad - good > 1:
            mid = (good + bad) // 2
            # after this one, at most ceil(log2(bad - good)) - 1 more: a total, an ETA
            left = math.ceil(math.log2(bad - good)) - 1
            if self._trial(mid, 'bisecting', left_after=left):
                good = mid
            else:
                bad = mid
        return good

    def largest_up_to(self, upper: int, known_good: int) -> int:
        """This rank's largest fitting batch in ``[known_good, upper]``: ``upper`` if it
        fits, else bisection, taking ``known_good`` to fit without trying it."""
        if not 0 <= known_good < upper:
            raise ValueError(f'need 0 <= known_good < upper, got known_good={known_good}, '
                             f'upper={upper}')
        self.trials = []
        with self.session(), self._progress():
            if self._trial(upper, 'upper bound',
                           left_after=math.ceil(math.log2(upper - known_good))):
                return upper
            return self._bisect(known_good, upper)

    def search(self) -> SearchResult:
        """Search on this rank, then agree on the minimum with the other ranks."""
        start = time.perf_counter()
        self.trials = []
        with self.session(), self._progress():
            local = self._largest_fitting()
        agreed = agree_min(local)
        if agreed < 1:
            raise RuntimeError(
                f'auto batch size: even a batch of 1 does not fit in '
                f'{format_bytes(self.limit_bytes)} ({self.margin:.0%} of '
                f'{format_bytes(self.probe.capacity_bytes())} kept free) on '
                f'{"this rank" if local < 1 else "another rank"}. Lower the margin, '
                'shrink the model or the point cloud range, or enable AMP.')
        return SearchResult(
            batch_size=agreed, local_batch_size=local,
            capacity_bytes=self.probe.capacity_bytes(), limit_bytes=self.limit_bytes,
            margin=self.margin, max_batch_size=self.max_batch_size,
            hit_upper_bound=local == self.max_batch_size,
            device_name=self.probe.device_name(),
            seconds=time.perf_counter() - start, trials=list(self.trials))
