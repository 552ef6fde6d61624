"""The fastest training arrangement that fits a memory budget.

An arrangement is a per-GPU batch with gradient checkpointing on or off (the precision
is the config's ``amp``: ``dtype='auto'`` is bf16 where the GPU has it, else fp16).
:class:`ArrangementFinder` tries arrangements in a preference order, each with the
device limited to ``(1 - margin)`` of the budget (as :class:`~.search.BatchSizeFinder`
does for one batch), times a few real training steps of those that fit, and picks the
fastest in samples/s. Larger batches without checkpointing come first: they keep
BatchNorm's statistics closest to the official recipe and usually train fastest, so a
later arrangement must be faster by ``min_gain`` to be chosen over an earlier one.

:class:`CheckpointSwitch` turns the gradient checkpointing a config asked for off and on
again on the built model (``with_cp`` flags of mmdet / mmdet3d / this package's
modules, BEVFusion's ``checkpoint_modules``), so one built model serves every trial.
"""
import gc
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from mmengine import dist
from mmengine.logging import print_log
from mmengine.optim import OptimWrapper
from torch import nn

from .memory_probe import CudaMemoryProbe, MemoryProbe, ModeledMemoryProbe
from .search import TrainingState, is_out_of_memory, local_sync_bn, one_step_per_call

GiB = 2**30


# ------------------------------------------------------------ gradient checkpointing
class CheckpointSwitch:
    """Turn the gradient checkpointing a built model was configured with off or on.

    Records, at construction, the modules whose boolean ``with_cp`` is True (mmdet's
    Swin blocks and ResNet blocks, this package's ``GeneralizedLSSFPN`` and
    ``DepthLSSTransform``, ...) and BEVFusion's ``checkpoint_modules``. ``set(False)``
    clears them, ``set(True)`` restores them: all of these modules read the flag at
    every forward, so no rebuild is needed. mmengine's ``activation_checkpointing``
    config key wraps forwards at build time and is not switched here.

    Args:
        model: the unwrapped model, as configured.
    """

    def __init__(self, model: nn.Module):
        self.model = model
        self.flagged: List[Tuple[str, nn.Module]] = [
            (name, m) for name, m in model.named_modules()
            if isinstance(getattr(m, 'with_cp', None), bool) and m.with_cp]
        self.listed: List[Tuple[str, nn.Module, tuple]] = [
            (name, m, tuple(m.checkpoint_modules)) for name, m in model.named_modules()
            if isinstance(getattr(m, 'checkpoint_modules', None), (tuple, list))
            and len(m.checkpoint_modules)]
        self._on = True

    @property
    def available(self) -> bool:
        """Whether the model was configured with any checkpointing to switch."""
        return bool(self.flagged or self.listed)

    @property
    def is_on(self) -> bool:
        return self._on and self.available

    def describe(self) -> str:
        """The checkpointed modules, for the log (top-level names, counted)."""
        counts: Dict[str, int] = {}
        for name, _ in self.flagged:
            top = name.split('.')[0] or type(self.model).__name__
            counts[top] = counts.get(top, 0) + 1
        parts = [f'{top} ({n} with_cp module{"s" if n > 1 else ""})'
                 for top, n in counts.items()]
        parts += [f'{name or "model"}.checkpoint_modules={list(mods)}'
                  for name, _, mods in self.listed]
        return ', '.join(parts) or 'none'

    def set(self, on: bool) -> None:
        """Checkpointing as configured (``True``) or none (``False``)."""
        for _, module in self.flagged:
            module.with_cp = bool(on)
        for _, module, mods in self.listed:
            module.checkpoint_modules = mods if on else ()
        self._on = bool(on)


# ---------------------------------------------------------------- arrangements, results
@dataclass(frozen=True)
class Arrangement:
    """A per-GPU batch with gradient checkpointing on (as configured) or off."""
    batch_size: int
    checkpointing: bool

    def label(self) -> str:
        mode = 'on' if self.checkpointing else 'off'
        return f'batch {self.batch_size}, checkpointing {mode}'


def preference_order(batch_sizes: Sequence[int],
                     can_checkpoint: bool) -> List[Arrangement]:
    """Largest batch first; at each batch without checkpointing first (faster when it
    fits), then with it. Without checkpointing to switch, one arrangement a batch."""
    modes = (False, True) if can_checkpoint else (False,)
    return [Arrangement(b, cp) for b in sorted(set(batch_sizes), reverse=True)
            for cp in modes]


@dataclass
class ArrangementTrial:
    """One arrangement's trial: ``fits`` is False on OOM or a peak above the limit;
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
    def arrangement(self) -> Arrangement:
        return Arrangement(self.batch_size, self.checkpointing)


@dataclass
class FitResult:
    """The chosen arrangement, its figures on this rank, and every trial.

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
    trials: List[ArrangementTrial] = field(default_factory=list)
    from_cache: bool = False

    @property
    def arrangement(self) -> Arrangement:
        return Arrangement(self.batch_size, self.checkpointing)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> 'FitResult':
        data = dict(data)
        data['trials'] = [ArrangementTrial(**t) for t in data.get('trials', [])]
        return cls(**data)


def choose(speeds: Sequence[Optional[float]], min_gain: float = 0.0) -> Optional[int]:
    """Index of the arrangement to train with, given each one's samples/s in preference
    order (None: does not fit). A later arrangement replaces the current pick only when
    faster by more than ``min_gain`` (a share); None when nothing fits."""
    best = None
    for i, speed in enumerate(speeds):
        if speed is None:
            continue
        if best is None or speed > speeds[best] * (1.0 + min_gain):
            best = i
    return best


def agree_speeds(speeds: Sequence[Optional[float]]) -> List[Optional[float]]:
    """Each arrangement's slowest speed over the ranks; None where any rank failed."""
    if dist.get_world_size() == 1:
        return list(speeds)
    values = torch.tensor([-1.0 if s is None else float(s) for s in speeds],
                          dtype=torch.float64)
    dist.all_reduce(values, op='min')
    return [None if v < 0 else float(v) for v in values.tolist()]


def format_bytes(num_bytes: Optional[int]) -> str:
    """``'17.25 GiB'``, or MiB below 1 GiB (modelled devices); ``'n/a'`` for None."""
    if num_bytes is None:
        return 'n/a'
    if num_bytes >= GiB:
        return f'{num_bytes / GiB:.2f} GiB'
    return f'{num_bytes / 2**20:.2f} MiB'


_gib = format_bytes


def _peak_allocated(probe: MemoryProbe) -> Optional[int]:
    if isinstance(probe, CudaMemoryProbe):
        return int(torch.cuda.max_memory_allocated(probe.device))
    return None


def format_trials(trials: Sequence[ArrangementTrial], chosen: Optional[Arrangement],
                  limit_bytes: int) -> str:
    """The trials as a table, the chosen one marked."""
    lines = [f'{"arrangement":<32} {"fits":<5} {"samples/s":>9} {"alloc. peak":>11} '
             f'{"reserved peak":>13}  (limit {_gib(limit_bytes)})']
    for t in trials:
        speed = '-' if t.samples_per_s is None else f'{t.samples_per_s:.2f}'
        fits = 'OOM' if t.oom else ('yes' if t.fits else 'no')
        mark = '  <- chosen' if chosen == t.arrangement else ''
        lines.append(f'{t.arrangement.label():<32} {fits:<5} {speed:>9} '
                     f'{_gib(t.peak_allocated_bytes):>11} '
                     f'{_gib(t.peak_reserved_bytes):>13}'
                     f'{mark}')
    return '\n'.join(lines)


# ------------------------------------------------------------------------ the search
class ArrangementFinder:
    """Fastest arrangement whose training steps run within a memory budget.

    Args:
        model: the unwrapped model (``BaseModel`` with ``train_step``).
        optim_wrapper: the runner's optim wrapper (AMP included: trials run in the
            precision training will use).
        make_batch: ``make_batch(n)`` returns a data batch of ``n`` samples as the train
            dataloader would yield it (:class:`~.samples.LargestSampleBatches`).
        probe: memory probe (:class:`~.memory_probe.CudaMemoryProbe` on a GPU).
        switch: the model's :class:`CheckpointSwitch`.
        arrangements: what to try, in preference order (:func:`preference_order`).
        budget_bytes: memory to fit in, bytes; None: the device's capacity. A budget
            above the capacity is lowered to it (with a warning). Defaults to None.
        margin: share of the budget kept free, in [0, 1): trials run with the device
            limited to ``budget x (1 - margin)``. Defaults to 0.1.
        warmup_steps: untimed training steps first (optimizer state, kernel selection,
            JIT compilation). Defaults to 2.
        timed_steps: timed training steps; the memory peaks are theirs. Defaults to 3.
        min_gain: share by which a later arrangement must be faster to be chosen over
            an earlier one. Defaults to 0.02.
        clock: seconds counter for the timing. Defaults to ``time.perf_counter``.
    """

    def __init__(self, model: nn.Module, optim_wrapper: OptimWrapper,
                 make_batch: Callable[[int], Any], probe: MemoryProbe,
                 switch: CheckpointSwitch, arrangements: Sequence[Arrangement],
                 budget_bytes: Optional[int] = None, margin: float = 0.1,
                 warmup_steps: int = 2, timed_steps: int = 3, min_gain: float = 0.02,
                 clock: Callable[[], float] = time.perf_counter):
        if not 0 <= margin < 1:
            raise ValueError(f'margin must be in [0, 1) (a share of the memory budget), '
                             f'got {margin}')
        if warmup_steps < 0 or timed_steps < 1:
            raise ValueError(f'need warmup_steps >= 0 and timed_steps >= 1, got '
                             f'{warmup_steps} and {timed_steps}')
        if min_gain < 0:
            raise ValueError(f'min_gain must be >= 0, got {min_gain}')
        if not arrangements:
            raise ValueError('no arrangements to try')
        if any(a.checkpointing for a in arrangements) and not switch.available:
            raise ValueError('arrangements with checkpointing, but the model was built '
                             'without any: enable with_cp in the config, or try only '
                             'arrangements without checkpointing.')
        self.model = model
        self.optim_wrapper = optim_wrapper
        self.make_batch = make_batch
        self.probe = probe
        self.switch = switch
        self.arrangements = list(arrangements)
        self.budget_bytes = self._fit_budget(budget_bytes)
        self.margin = float(margin)
        self.warmup_steps = int(warmup_steps)
        self.timed_steps = int(timed_steps)
        self.min_gain = float(min_gain)
        self.clock = clock
        self.trials: List[ArrangementTrial] = []

    def _fit_budget(self, budget: Optional[int]) -> int:
        capacity = self.probe.capacity_bytes()
        if budget is None:
            return capacity
        if budget > capacity + 2**20:  # a cap of exactly the budget rounds below it
            print_log(f'fastest fit: the memory budget {_gib(budget)} is more than the '
                      f'{_gib(capacity)} this device has ({self.probe.device_name()}): '
                      f'fitting into {_gib(capacity)} instead.', logger='current',
                      level=logging.WARNING)
        return min(int(budget), capacity)

    @property
    def limit_bytes(self) -> int:
        return int(self.budget_bytes * (1.0 - self.margin))

    def _sync(self) -> None:
        if isinstance(self.probe, CudaMemoryProbe):
            torch.cuda.synchronize(self.probe.device)

    def _release(self) -> None:
        gc.collect()
        self.probe.release()

    def _steps(self, data: Any, count: int) -> None:
        for _ in range(count):
            self.model.train_step(data, optim_wrapper=self.optim_wrapper)

    def try_arrangement(self, arrangement: Arrangement,
                        state: TrainingState) -> ArrangementTrial:
        """Train ``warmup_steps`` + ``timed_steps`` steps in ``arrangement`` under the
        limit; put ``state`` back whatever happens."""
        start = self.clock()
        oom, speed, allocated, reserved = False, None, None, None
        self.probe.reset()
        try:
            self.switch.set(arrangement.checkpointing)
            data = self.make_batch(arrangement.batch_size)
            self.model.train()
            with self.probe.limit(self.limit_bytes), \
                    one_step_per_call(self.optim_wrapper):
                self._steps(data, self.warmup_steps)
                self._sync()
                self.probe.reset()  # peaks after warm-up
                begin = self.clock()
                self._steps(data, self.timed_steps)
                reserved = self.probe.peak_bytes()  # synchronises on CUDA
                elapsed = self.clock() - begin
                allocated = _peak_allocated(self.probe)
            speed = arrangement.batch_size * self.timed_steps / max(elapsed, 1e-9)
        except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:
            if not is_out_of_memory(exc):
                raise
            oom = True  # the traceback (and the tensors its frames hold) dies here
        finally:
            data = None
            state.restore()
            self._release()
        fits = not oom and reserved is not None and reserved <= self.limit_bytes
        trial = ArrangementTrial(
            arrangement.batch_size, arrangement.checkpointing, fits, oom,
            speed if fits else None, allocated, reserved, self.clock() - start)
        self.trials.append(trial)
        print_log(f'fastest fit: {arrangement.label()}: '
                  + (f'{speed:.2f} samples/s, {_gib(reserved)} reserved of '
                     f'{_gib(self.limit_bytes)} allowed' if fits else
                     f'does not fit ({"OOM" if oom else _gib(reserved)} of '
                     f'{_gib(self.limit_bytes)} allowed)'), logger='current')
        return trial

    def search(self) -> FitResult:
        """Try every arrangement on this rank, agree with the other ranks, choose."""
        start = self.clock()
        self.trials = []
        state = TrainingState(self.model, self.optim_wrapper)
        self._release()
        try:
            with local_sync_bn(self.model):
                for arrangement in self.arrangements:
                    self.try_arrangement(arrangement, state)
        finally:
            self.switch.set(True)  # as built until the caller applies the choice
        speeds = agree_speeds([t.samples_per_s for t in self.trials])
        pick = choose(speeds, self.min_gain)
        if pick is None:
            local = all(t.samples_per_s is None for t in self.trials)
            raise RuntimeError(
                f'fastest fit: no arrangement trains in {_gib(self.limit_bytes)} '
                f'({self.margin:.0%} of the {_gib(self.budget_bytes)} budget kept free) '
                f'on {"this rank" if local else "another rank"}:\n'
                f'{format_trials(self.trials, None, self.limit_bytes)}\n'
                'Raise scaling.memory_budget, lower the margin, add batch 1 to the '
                'arrangements, or enable gradient checkpointing (with_cp) in the model.')
        chosen = self.trials[pick]
        return FitResult(
            batch_size=chosen.batch_size, checkpointing=chosen.checkpointing,
            samples_per_s=float(speeds[pick]),
            peak_allocated_bytes=chosen.peak_allocated_bytes,
            peak_reserved_bytes=chosen.peak_reserved_bytes,
            budget_bytes=self.budget_bytes, limit_bytes=self.limit_bytes,
            margin=self.margin, device_name=self.probe.device_name(),
            seconds=self.clock() - start, trials=list(self.trials))


# ------------------------------------------------------------- a modelled device
class ModeledCheckpointingProbe(ModeledMemoryProbe):
    """:class:`~.memory_probe.ModeledMemoryProbe` whose per-sample bytes depend on the
    gradient checkpointing in force (CPU runs and tests of the arrangement search).

    Args:
        switch_model: the module whose ``with_cp`` flags / ``checkpoint_modules`` say
            whether checkpointing is on; defaults to ``model``.
        checkpointed_bytes_per_sample: bytes per sample while any is on. Defaults to
            ``bytes_per_sample`` (checkpointing saves nothing).
        **kwargs: :class:`~.memory_probe.ModeledMemoryProbe`'s arguments.
    """

    def __init__(self, model: nn.Module,
                 checkpointed_bytes_per_sample: Optional[float] = None,
                 switch_model: Optional[nn.Module] = None, **kwargs):
        super().__init__(model, **kwargs)
        self.plain_bytes_per_sample = self.bytes_per_sample
        self.checkpointed_bytes_per_sample = (
            self.bytes_per_sample if checkpointed_bytes_per_sample is None
            else float(checkpointed_bytes_per_sample))
        self.switch_model = switch_model or model

    def _checkpointing_on(self) -> bool:
        for m in self.switch_model.modules():
            if getattr(m, 'with_cp', False) is True or \
                    len(getattr(m, 'checkpoint_modules', ()) or ()) > 0:
                return True
        return False

    def _count(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self.bytes_per_sample = (self.checkpointed_bytes_per_sample
                                 if self._checkpointing_on()
                                 else self.plain_bytes_per_sample)
        super()._count(module, args, kwargs)

