"""Find the largest per-device batch that trains without running out of memory.

A trial is ``steps_per_trial`` real ``train_step`` calls (forward, backward, optimizer
step) on one batch built from the dataset's largest samples (:mod:`.samples`), with the
device limited to ``(1 - margin)`` of its capacity (:meth:`MemoryProbe.limit`). The
search doubles the batch from ``init_batch_size`` until a trial fails, then bisects
between the last success and the first failure. A trial fails when it runs out of memory
under that limit (or reports a peak above it).

Every trial starts from the same model / optimizer / RNG state (copied to the CPU before
the search) and the state is put back afterwards, so the search leaves no trace in the
training run. Trials run on the unwrapped model with no cross-rank communication (DDP
gradient sync and SyncBN statistics are local), so one rank running out of memory cannot
leave the others waiting in a collective; ranks then agree on the minimum.

Memory is read through a probe (:mod:`.memory_probe`): the CUDA allocator on a GPU, a
model of the device on a CPU.

Rank 0 shows a progress bar of the trials (phase, batch size; an ETA once the
bisection's length is known) under :mod:`mmdet3d_scaling.utils.progress`'s policy.
"""
import contextlib
import copy
import gc
import math
import random
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator, List, Optional

import numpy as np
import torch
from mmengine import dist
from mmengine.logging import print_log
from mmengine.optim import OptimWrapper
from torch import nn

from ..utils import progress
from ..engine.optim_state import (count_state, optim_wrappers, restore_count_state,
                                  step_every_call)
from .memory_probe import MemoryProbe

_OOM_MESSAGES = ('out of memory', 'CUBLAS_STATUS_ALLOC_FAILED',
                 'cudaErrorMemoryAllocation')


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is the device running out of memory (not some other failure)."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in _OOM_MESSAGES)


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
class SearchResult:
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

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> 'SearchResult':
        data = dict(data)
        data['trials'] = [Trial(**t) for t in data.get('trials', [])]
        return cls(**data)


# ------------------------------------------------------------------- state snapshots
def _to_cpu(obj: Any) -> Any:
    """Deep copy of a nested state with every tensor cloned to the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to('cpu', copy=True)
    if isinstance(obj, OrderedDict):  # a module state dict: keep its version metadata
        out = OrderedDict((k, _to_cpu(v)) for k, v in obj.items())
        if hasattr(obj, '_metadata'):
            out._metadata = copy.deepcopy(obj._metadata)
        return out
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_to_cpu(v) for v in obj)
    return obj


class TrainingState:
    """A CPU copy of what a trial changes: weights, buffers, optimizer, counters, RNG."""

    def __init__(self, model: nn.Module, optim_wrapper: OptimWrapper):
        self.model = model
        self.optim_wrapper = optim_wrapper
        self.training = model.training
        self.model_state = _to_cpu(model.state_dict())
        self.optim_state = _to_cpu(optim_wrapper.state_dict())
        self.counts = [count_state(w) for w in optim_wrappers(optim_wrapper)]
        self.rng = dict(python=random.getstate(), numpy=np.random.get_state(),
                        torch=torch.get_rng_state(),
                        cuda=torch.cuda.get_rng_state_all()
                        if torch.cuda.is_available() else None)

    def restore(self) -> None:
        for p in self.model.parameters():
            p.grad = None
        self.model.load_state_dict(self.model_state, strict=True)
        self.optim_wrapper.load_state_dict(self.optim_state)
        for wrapper, counts in zip(optim_wrappers(self.optim_wrapper), self.counts):
            restore_count_state(wrapper, counts)
        random.setstate(self.rng['python'])
        np.random.set_state(self.rng['numpy'])
        torch.set_rng_state(self.rng['torch'])
        if self.rng['cuda'] is not None:
            torch.cuda.set_rng_state_all(self.rng['cuda'])
        self.model.train(self.training)


@contextlib.contextmanager
def one_step_per_call(optim_wrapper: OptimWrapper) -> Iterator[None]:
    """Every ``update_params`` steps the optimizer (no accumulation) inside the block."""
    step_every_call(optim_wrapper)
    yield  # TrainingState.restore puts the counters back


@contextlib.contextmanager
def local_sync_bn(model: nn.Module) -> Iterator[None]:
    """Make ``torch.nn.SyncBatchNorm`` layers use only this rank's batch inside the block.

    Their statistics all-gather would otherwise block every rank on a rank that ran out
    of memory. All ranks must enter this together (it creates process groups).
    """
    layers = [m for m in model.modules() if isinstance(m, nn.SyncBatchNorm)]
    world_size = dist.get_world_size()
    if world_size == 1 or not layers:
        yield
        return
    import torch.distributed as torch_dist
    singles = [torch_dist.new_group([r]) for r in range(world_size)]
    own = singles[dist.get_rank()]
    saved = [m.process_group for m in layers]
    for m in layers:
        m.process_group = own
    try:
        yield
    finally:
        for m, group in zip(layers, saved):
            m.process_group = group


# ------------------------------------------------------------------------ the search
class BatchSizeFinder:
    """Largest batch whose training steps run in ``(1 - margin)`` of device memory.

    Args:
        model: the unwrapped model (``BaseModel`` with ``train_step``).
        optim_wrapper: the runner's optim wrapper (its optimizer allocates state on the
            first step, which the trials include).
        make_batch: ``make_batch(n)`` returns a data batch of ``n`` samples as the train
            dataloader would yield it (see :class:`~.samples.LargestSampleBatches`).
        probe: memory probe (:class:`~.memory_probe.CudaMemoryProbe` on a GPU).
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
        if not 0 <= margin < 1:
            raise ValueError(f'margin must be in [0, 1) (a share of device memory), '
                             f'got {margin}')
        if steps_per_trial < 1:
            raise ValueError(f'steps_per_trial must be >= 1, got {steps_per_trial}')
        if not 1 <= init_batch_size <= max_batch_size:
            raise ValueError(
                f'need 1 <= init_batch_size <= max_batch_size, got init_batch_size='
                f'{init_batch_size}, max_batch_size={max_batch_size}')
        self.model = model
        self.optim_wrapper = optim_wrapper
        self.make_batch = make_batch
        self.probe = probe
        self.margin = float(margin)
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

    def _trial(self, batch_size: int, phase: str, state: TrainingState,
               left_after: Optional[int] = None) -> bool:
        """``try_batch`` with the bar showing the phase and batch; ``left_after``: the
        trials that follow at most (None: not known yet)."""
        bar = self._bar
        if left_after is not None:
            bar.total = bar.n + 1 + left_after
        bar.set_postfix_str(f'{phase}, batch={batch_size}')
        fits = self.try_batch(batch_size, state).fits
        bar.update(1)
        return fits

    @property
    def limit_bytes(self) -> int:
        return int(self.probe.capacity_bytes() * (1.0 - self.margin))

    def _release(self) -> None:
        gc.collect()
        self.probe.release()

    def try_batch(self, batch_size: int, state: TrainingState) -> Trial:
        """Run one trial at ``batch_size`` and put ``state`` back, whatever happens."""
        start = time.perf_counter()
        oom, peak = False, None
        self.probe.reset()
        try:
            data = self.make_batch(batch_size)
            self.model.train()
            with self.probe.limit(self.limit_bytes), \
                    one_step_per_call(self.optim_wrapper):
                for step in range(self.steps_per_trial):
                    if step and self.new_batch_each_step:
                        data = self.make_batch(batch_size)
                    self.model.train_step(data, optim_wrapper=self.optim_wrapper)
                peak = self.probe.peak_bytes()
        except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:
            if not is_out_of_memory(exc):
                raise
            oom = True  # the traceback (and the tensors its frames hold) dies here
        finally:
            data = None
            state.restore()
            self._release()
        fits = not oom and peak is not None and peak <= self.limit_bytes
        trial = Trial(batch_size, fits, peak, oom, time.perf_counter() - start)
        self.trials.append(trial)
        with progress.writing():  # the bar leaves the terminal line for the log line
            print_log(f'auto batch size: batch {batch_size} '
                      f'{"fits" if fits else "does not fit"} '
                      f'({"OOM" if oom else _gib(peak)} of {_gib(self.limit_bytes)} '
                      'allowed)', logger='current')
        return trial

    def _largest_fitting(self, state: TrainingState) -> int:
        good, bad = 0, None
        size = self.init_batch_size
        while True:  # grow by powers of two
            if self._trial(size, 'doubling', state):
                good = size
                if size == self.max_batch_size:
                    return good
                size = min(size * 2, self.max_batch_size)
            else:
                bad = size
                break
        return self._bisect(good, bad, state)

    def _bisect(self, good: int, bad: int, state: TrainingState) -> int:
        """Largest fitting batch between a success ``good`` and a failure ``bad``."""
        while bad - good > 1:
            mid = (good + bad) // 2
            # after this one, at most ceil(log2(bad - good)) - 1 more: a total, an ETA
            left = math.ceil(math.log2(bad - good)) - 1
            if self._trial(mid, 'bisecting', state, left_after=left):
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
        state = TrainingState(self.model, self.optim_wrapper)
        self._release()
        with local_sync_bn(self.model), self._progress():
            if self._trial(upper, 'upper bound', state,
                           left_after=math.ceil(math.log2(upper - known_good))):
                return upper
            return self._bisect(known_good, upper, state)

    def search(self) -> SearchResult:
        """Search on this rank, then agree on the minimum with the other ranks."""
        start = time.perf_counter()
        self.trials = []
        state = TrainingState(self.model, self.optim_wrapper)
        self._release()
        with local_sync_bn(self.model), self._progress():
            local = self._largest_fitting(state)
        agreed = agree_min(local)
        if agreed < 1:
            raise RuntimeError(
                f'auto batch size: even a batch of 1 does not fit in '
                f'{_gib(self.limit_bytes)} ({self.margin:.0%} of '
                f'{_gib(self.probe.capacity_bytes())} kept free) on '
                f'{"this rank" if local < 1 else "another rank"}. Lower the margin, '
                'shrink the model or the point cloud range, or enable AMP.')
        return SearchResult(
            batch_size=agreed, local_batch_size=local,
            capacity_bytes=self.probe.capacity_bytes(), limit_bytes=self.limit_bytes,
            margin=self.margin, max_batch_size=self.max_batch_size,
            hit_upper_bound=local == self.max_batch_size,
            device_name=self.probe.device_name(),
            seconds=time.perf_counter() - start, trials=list(self.trials))


def agree_min(value: int) -> int:
    """The minimum of ``value`` over all ranks (``value`` itself when not distributed)."""
    if dist.get_world_size() == 1:
        return int(value)
    tensor = torch.tensor([int(value)], dtype=torch.int64)
    dist.all_reduce(tensor, op='min')
    return int(tensor.item())


def _gib(num_bytes: Optional[int]) -> str:
    return 'n/a' if num_bytes is None else f'{num_bytes / 2**30:.2f} GiB'
