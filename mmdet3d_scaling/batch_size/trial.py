"""What every trial of both searches shares: the state it restores, the memory limit it
runs under, the out-of-memory errors it survives and the cross-rank agreement.

A trial is a few real ``train_step`` calls (forward, backward, optimizer step) with the
device limited to a number of bytes (:meth:`MemoryProbe.limit`). Every trial starts
from the same model / optimizer / RNG state (copied to the CPU before the search) and
the state is put back afterwards, so a search leaves no trace in the training run (CUDA
graphs a trial captured are dropped with it: :func:`~..models.cuda_graphs.release_graphs`).
Trials run on the unwrapped model with no cross-rank communication (DDP gradient sync
and SyncBN statistics are local), so one rank running out of memory cannot leave the
others waiting in a collective; ranks agree on the outcome after the trials.

:class:`TrialSearch` holds this frame once; :class:`~.search.BatchSizeFinder` (the
largest batch) and :class:`~.fastest_fit.FastestFitFinder` (the fastest candidate) say
only what a trial measures and what to try next.
"""
import contextlib
import copy
import gc
import random
from collections import OrderedDict
from dataclasses import asdict
from typing import Any, Callable, Iterator, Optional, TypeVar

import numpy as np
import torch
from mmengine import dist
from mmengine.optim import OptimWrapper
from torch import nn

from ..engine.optim_state import (count_state, optim_wrappers, restore_count_state,
                                  step_every_call)
from ..models.cuda_graphs import release_graphs
from .memory_probe import MemoryProbe

_OOM_MESSAGES = ('out of memory', 'CUBLAS_STATUS_ALLOC_FAILED',
                 'cudaErrorMemoryAllocation')
GiB = 2**30
T = TypeVar('T')


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is the device running out of memory (not some other failure)."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in _OOM_MESSAGES)


def format_bytes(num_bytes: Optional[int]) -> str:
    """``'17.25 GiB'``, or MiB below 1 GiB (modelled devices); ``'n/a'`` for None."""
    if num_bytes is None:
        return 'n/a'
    if num_bytes >= GiB:
        return f'{num_bytes / GiB:.2f} GiB'
    return f'{num_bytes / 2**20:.2f} MiB'


def agree_min(value: int) -> int:
    """The minimum of ``value`` over all ranks (``value`` itself when not distributed)."""
    if dist.get_world_size() == 1:
        return int(value)
    tensor = torch.tensor([int(value)], dtype=torch.int64)
    dist.all_reduce(tensor, op='min')
    return int(tensor.item())


class ResultRecord:
    """JSON form of a search's result dataclass (the cache's entries): its fields, the
    trials as ``trial_type`` records."""
    trial_type: type  # set by each result class

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict):
        data = dict(data)
        data['trials'] = [cls.trial_type(**t) for t in data.get('trials', [])]
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


# ------------------------------------------------------------------- the trial frame
class TrialSearch:
    """The frame both searches run their trials in.

    Args:
        model: the unwrapped model (``BaseModel`` with ``train_step``).
        optim_wrapper: the runner's optim wrapper (AMP included: trials run in the
            precision training will use; its optimizer allocates state on the first
            step, which the trials include).
        make_batch: ``make_batch(n)`` returns a data batch of ``n`` samples as the train
            dataloader would yield it (:class:`~.samples.LargestSampleBatches`).
        probe: memory probe (:class:`~.memory_probe.CudaMemoryProbe` on a GPU).
        margin: share of the memory kept free, in [0, 1). Defaults to 0.1.
    """

    def __init__(self, model: nn.Module, optim_wrapper: OptimWrapper,
                 make_batch: Callable[[int], Any], probe: MemoryProbe,
                 margin: float = 0.1):
        if not 0 <= margin < 1:
            raise ValueError(f'margin must be in [0, 1) (a share of the memory), got '
                             f'{margin}')
        self.model = model
        self.optim_wrapper = optim_wrapper
        self.make_batch = make_batch
        self.probe = probe
        self.margin = float(margin)
        self._state: Optional[TrainingState] = None

    @property
    def memory_bytes(self) -> int:
        """The memory to fit in: the device's capacity."""
        return self.probe.capacity_bytes()

    @property
    def limit_bytes(self) -> int:
        """Bytes a trial may use: :attr:`memory_bytes` less the margin."""
        return int(self.memory_bytes * (1.0 - self.margin))

    def _release(self) -> None:
        gc.collect()
        self.probe.release()

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """The block a search runs its trials in, on this rank: the state they restore
        is taken at entry, SyncBN is local. All ranks enter it together."""
        self._state = TrainingState(self.model, self.optim_wrapper)
        self._release()
        try:
            with local_sync_bn(self.model):
                yield
        finally:
            self._state = None

    def run_trial(self, steps: Callable[[], T]) -> Optional[T]:
        """``steps()`` (a trial's training steps; what it returns is the measurement)
        in train mode under :attr:`limit_bytes`, one optimizer step per call; None when
        the device ran out of memory. The state is put back whatever happens."""
        assert self._state is not None, 'run_trial outside session()'
        self.probe.reset()
        try:
            self.model.train()
            with self.probe.limit(self.limit_bytes), \
                    one_step_per_call(self.optim_wrapper):
                return steps()
        except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:
            if not is_out_of_memory(exc):
                raise
            return None  # the traceback (and the tensors its frames hold) dies here
        finally:
            self._state.restore()
            # a graph captured for this trial's batch (and its memory pool) must not
            # count against the next trial, nor stay for training
            release_graphs(self.model)
            self._release()
