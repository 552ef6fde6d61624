"""The fastest fit: the per-GPU batch and gradient checkpointing that train fastest in a
memory budget (``scaling.memory_budget``).

A variant is a per-GPU batch with gradient checkpointing on (as configured) or off;
the precision is the config's ``amp`` (``dtype='auto'``: bf16 where the GPU has it,
else fp16). :class:`FastestFitFinder` tries the variants in a preference order, each
in the frame of :mod:`.trial` with the device limited to ``(1 - margin)`` of the budget,
times a few real training steps of those that fit, and picks the fastest in samples/s.
Larger batches without checkpointing come first: they keep BatchNorm's statistics
closest to the official recipe and usually train fastest, so a later variant must be
faster by ``min_gain`` to be chosen over an earlier one. The checkpointing is switched
on the built model by :class:`~.checkpoint_switch.CheckpointSwitch`.
"""
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
from mmengine import dist
from mmengine.logging import print_log
from mmengine.optim import OptimWrapper
from torch import nn

from .checkpoint_switch import CheckpointSwitch
from .memory_probe import CudaMemoryProbe, MemoryProbe
from .trial import ResultRecord, TrialSearch, format_bytes


# ---------------------------------------------------------------- variants, results
@dataclass(frozen=True)
class Variant:
    """A per-GPU batch with gradient checkpointing on (as configured) or off."""
    batch_size: int
    checkpointing: bool

    def label(self) -> str:
        mode = 'on' if self.checkpointing else 'off'
        return f'batch {self.batch_size}, checkpointing {mode}'


def preference_order(batch_sizes: Sequence[int],
                     can_checkpoint: bool) -> List[Variant]:
    """Largest batch first; at each batch without checkpointing first (faster when it
    fits), then with it. Without checkpointing to switch, one variant a batch."""
    modes = (False, True) if can_checkpoint else (False,)
    return [Variant(b, cp) for b in sorted(set(batch_sizes), reverse=True)
            for cp in modes]


@dataclass
class FitTrial:
    """One variant's trial: ``fits`` is False on OOM or a peak above the limit;
    speed and memory are measured after ``warmup_steps`` (None when it did not fit)."""
    batch_size: int
    checkpointing: bool
    fits: bool
    oom: bool
    samples_per_s: Optional[float]
    peak_allocated_bytes: Optional[int]
    peak_reserved_bytes: Optional[int]
    seconds: float

    @property
    def variant(self) -> Variant:
        return Variant(self.batch_size, self.checkpointing)


@dataclass
class FitResult(ResultRecord):
    """The chosen variant, its figures on this rank, and every trial.

    ``samples_per_s`` is the speed the choice was made on (the slowest rank's);
    ``budget_bytes`` the memory the search fitted into (budget or card, the smaller),
    ``limit_bytes`` what trials could use (``budget_bytes x (1 - margin)``).
    """
    batch_size: int
    checkpointing: bool
    samples_per_s: float
    peak_allocated_bytes: Optional[int]
    peak_reserved_bytes: Optional[int]
    budget_bytes: int
    limit_bytes: int
    margin: float
    device_name: str
    seconds: float
    trials: List[FitTrial] = field(default_factory=list)
    from_cache: bool = False
    trial_type = FitTrial  # a class attribute, not a field: what the trials are

    @property
    def variant(self) -> Variant:
        return Variant(self.batch_size, self.checkpointing)


def choose(speeds: Sequence[Optional[float]], min_gain: float = 0.0) -> Optional[int]:
    """Index of the variant to train with, given each one's samples/s in preference
    order (None: does not fit). A later variant replaces the current pick only when
    faster by more than ``min_gain`` (a share); None when nothing fits."""
    best = None
    for i, speed in enumerate(speeds):
        if speed is None:
            continue
        if best is None or speed > speeds[best] * (1.0 + min_gain):
            best = i
    return best


def agree_speeds(speeds: Sequence[Optional[float]]) -> List[Optional[float]]:
    """Each variant's slowest speed over the ranks; None where any rank failed."""
    if dist.get_world_size() == 1:
        return list(speeds)
    values = torch.tensor([-1.0 if s is None else float(s) for s in speeds],
                          dtype=torch.float64)
    dist.all_reduce(values, op='min')
    return [None if v < 0 else float(v) for v in values.tolist()]


def _peak_allocated(probe: MemoryProbe) -> Optional[int]:
    if isinstance(probe, CudaMemoryProbe):
        return int(torch.cuda.max_memory_allocated(probe.device))
    return None


def format_trials(trials: Sequence[FitTrial], chosen: Optional[Variant],
                  limit_bytes: int) -> str:
    """The trials as a table, the chosen one marked."""
    size = format_bytes
    lines = [f'{"variant":<32} {"fits":<5} {"samples/s":>9} {"alloc. peak":>11} '
             f'{"reserved peak":>13}  (limit {size(limit_bytes)})']
    for t in trials:
        speed = '-' if t.samples_per_s is None else f'{t.samples_per_s:.2f}'
        fits = 'OOM' if t.oom else ('yes' if t.fits else 'no')
        mark = '  <- chosen' if chosen == t.variant else ''
        lines.append(f'{t.variant.label():<32} {fits:<5} {speed:>9} '
                     f'{size(t.peak_allocated_bytes):>11} '
                     f'{size(t.peak_reserved_bytes):>13}{mark}')
    return '\n'.join(lines)


# ------------------------------------------------------------------------ the search
class FastestFitFinder(TrialSearch):
    """Fastest variant whose training steps run within a memory budget.

    Args:
        model, optim_wrapper, make_batch, probe: as :class:`~.trial.TrialSearch`.
        switch: the model's :class:`~.checkpoint_switch.CheckpointSwitch`.
        variants: what to try, in preference order (:func:`preference_order`).
        budget_bytes: memory to fit in, bytes; None: the device's capacity. A budget
            above the capacity is lowered to it (with a warning). Defaults to None.
        margin: share of the budget kept free, in [0, 1): trials run with the device
            limited to ``budget x (1 - margin)``. Defaults to 0.1.
        warmup_steps: untimed training steps first (optimizer state, kernel selection,
            JIT compilation). Defaults to 2.
        timed_steps: timed training steps; the memory peaks are theirs. Defaults to 3.
        min_gain: share by which a later variant must be faster to be chosen over
            an earlier one. Defaults to 0.02.
        clock: seconds counter for the timing. Defaults to ``time.perf_counter``.
    """

    def __init__(self, model: nn.Module, optim_wrapper: OptimWrapper,
                 make_batch: Callable[[int], Any], probe: MemoryProbe,
                 switch: CheckpointSwitch, variants: Sequence[Variant],
                 budget_bytes: Optional[int] = None, margin: float = 0.1,
                 warmup_steps: int = 2, timed_steps: int = 3, min_gain: float = 0.02,
                 clock: Callable[[], float] = time.perf_counter):
        super().__init__(model, optim_wrapper, make_batch, probe, margin)
        if warmup_steps < 0 or timed_steps < 1:
            raise ValueError(f'need warmup_steps >= 0 and timed_steps >= 1, got '
                             f'{warmup_steps} and {timed_steps}')
        if min_gain < 0:
            raise ValueError(f'min_gain must be >= 0, got {min_gain}')
        if not variants:
            raise ValueError('no variants to try')
        if any(c.checkpointing for c in variants) and not switch.available:
            raise ValueError('variants with checkpointing, but the model was built '
                             'without any: enable with_cp in the config, or try only '
                             'variants without checkpointing.')
        self.switch = switch
        self.variants = list(variants)
        self.budget_bytes = self._fit_budget(budget_bytes)
        self.warmup_steps = int(warmup_steps)
        self.timed_steps = int(timed_steps)
        self.min_gain = float(min_gain)
        self.clock = clock
        self.trials: List[FitTrial] = []

    def _fit_budget(self, budget: Optional[int]) -> int:
        capacity = self.probe.capacity_bytes()
        if budget is None:
            return capacity
        if budget > capacity + 2**20:  # a cap of exactly the budget rounds below it
            print_log(f'fastest fit: the memory budget {format_bytes(budget)} is more '
                      f'than the {format_bytes(capacity)} this device has '
                      f'({self.probe.device_name()}): fitting into '
                      f'{format_bytes(capacity)} instead.', logger='current',
                      level=logging.WARNING)
        return min(int(budget), capacity)

    @property
    def memory_bytes(self) -> int:
        """The memory to fit in: the budget (at most the device's capacity)."""
        return self.budget_bytes

    def _sync(self) -> None:
        if isinstance(self.probe, CudaMemoryProbe):
            torch.cuda.synchronize(self.probe.device)

    def _run_steps(self, data: Any, count: int) -> None:
        for _ in range(count):
            self.model.train_step(data, optim_wrapper=self.optim_wrapper)

    def _timed_steps(self, variant: Variant) -> Tuple[float, int, Optional[int]]:
        """Warm-up, then timed steps: (samples/s, reserved peak, allocated peak)."""
        self.switch.set(variant.checkpointing)
        data = self.make_batch(variant.batch_size)
        self._run_steps(data, self.warmup_steps)
        self._sync()
        self.probe.reset()  # peaks after warm-up
        begin = self.clock()
        self._run_steps(data, self.timed_steps)
        reserved = self.probe.peak_bytes()  # synchronises on CUDA
        elapsed = self.clock() - begin
        speed = variant.batch_size * self.timed_steps / max(elapsed, 1e-9)
        return speed, reserved, _peak_allocated(self.probe)

    def try_variant(self, variant: Variant) -> FitTrial:
        """Train ``warmup_steps`` + ``timed_steps`` steps as ``variant`` under the
        limit (inside :meth:`session`)."""
        start = self.clock()
        measured = self.run_trial(lambda: self._timed_steps(variant))
        oom = measured is None
        speed, reserved, allocated = (None, None, None) if oom else measured
        fits = not oom and reserved <= self.limit_bytes
        trial = FitTrial(variant.batch_size, variant.checkpointing, fits, oom,
                         speed if fits else None, allocated, reserved,
                         self.clock() - start)
        self.trials.append(trial)
        limit = format_bytes(self.limit_bytes)
        print_log(f'fastest fit: {variant.label()}: '
                  + (f'{speed:.2f} samples/s, {format_bytes(reserved)} reserved of '
                     f'{limit} allowed' if fits else
                     f'does not fit ({"OOM" if oom else format_bytes(reserved)} of '
                     f'{limit} allowed)'), logger='current')
        return trial

    def search(self) -> FitResult:
        """Try every variant on this rank, agree with the other ranks, choose."""
        start = self.clock()
        self.trials = []
        try:
            with self.session():
                for variant in self.variants:
                    self.try_variant(variant)
        finally:
            self.switch.set(True)  # as built until the caller applies the choice
        speeds = agree_speeds([t.samples_per_s for t in self.trials])
        pick = choose(speeds, self.min_gain)
        if pick is None:
            local = all(t.samples_per_s is None for t in self.trials)
            raise RuntimeError(
                f'fastest fit: no variant trains in {format_bytes(self.limit_bytes)} '
                f'({self.margin:.0%} of the {format_bytes(self.budget_bytes)} budget '
                f'kept free) on {"this rank" if local else "another rank"}:\n'
                f'{format_trials(self.trials, None, self.limit_bytes)}\n'
                'Raise scaling.memory_budget, lower the margin, add batch 1 to the '
                'variants, or enable gradient checkpointing (with_cp) in the model.')
        chosen = self.trials[pick]
        return FitResult(
            batch_size=chosen.batch_size, checkpointing=chosen.checkpointing,
            samples_per_s=float(speeds[pick]),
            peak_allocated_bytes=chosen.peak_allocated_bytes,
            peak_reserved_bytes=chosen.peak_reserved_bytes,
            budget_bytes=self.budget_bytes, limit_bytes=self.limit_bytes,
            margin=self.margin, device_name=self.probe.device_name(),
            seconds=self.clock() - start, trials=list(self.trials))
