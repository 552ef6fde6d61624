"""Scalars of a training iteration read without making the CPU wait for the GPU.

Why: mmengine reads every logged loss with ``.item()`` and norm clipping's gradient
norm with ``float()`` each iteration; on CUDA the first of those reads waits until the
GPU has finished the whole step, so the host cannot queue the next step's work while
the GPU runs the tail of this one. Here an iteration's values are stacked into one
tensor, copied into pinned host memory without blocking, and an event marks the copy;
the values are read one iteration later (the copy has finished by then: no wait) or,
where a reader needs them now, at once (waiting for the copy).

CPU tensors are read at once (a read costs no wait there). Values are kept as float64,
so a float32 / bf16 / fp16 loss reads exactly as ``.item()`` reads it.
"""
from collections import deque
from typing import Deque, Dict, List, NamedTuple, Optional, Tuple, Union

import torch
from torch import Tensor

#: message hub info keys: the sink of the current training run (a DeferredScalars),
#: and the last values it handed over, as ``(serial, [(iteration, {key: value})])``
SINK_INFO = 'deferred_scalars'
DRAINED_INFO = 'deferred_scalars_drained'

Values = Dict[str, float]


class _Pending(NamedTuple):
    iteration: int
    keys: List[str]  # in the order they were added
    on_device: List[int]  # positions of ``keys`` whose values are in ``host``
    host: Tensor  # pinned float64, filled by a non-blocking copy
    event: Optional['torch.cuda.Event']
    read: Dict[int, float]  # positions whose values were on the host already


class DeferredScalars:
    """Iteration-tagged scalars, handed over in iteration order once on the host."""

    def __init__(self) -> None:
        self._open: Dict[str, Union[Tensor, float]] = {}
        self._pending: Deque[_Pending] = deque()

    def add(self, key: str, value: Union[Tensor, float]) -> None:
        """Keep ``value`` (a one-element tensor or a number) as ``key`` of the open
        iteration."""
        if torch.is_tensor(value) and value.numel() != 1:
            raise ValueError(f'deferred scalar {key!r}: expected one element, got shape '
                             f'{tuple(value.shape)}')
        self._open.pop(key, None)  # a key added again moves to the end, as in a dict
        on_gpu = torch.is_tensor(value) and value.is_cuda
        if torch.is_tensor(value):
            value = value.detach()
        self._open[key] = value.reshape(()) if on_gpu else float(value)

    def seal(self, iteration: int) -> None:
        """Close the open iteration: start the copy of its device values."""
        if not self._open:
            return
        keys = list(self._open)
        on_device = [i for i, k in enumerate(keys) if torch.is_tensor(self._open[k])]
        read = {i: self._open[k] for i, k in enumerate(keys) if i not in on_device}
        host, event = torch.empty(0, dtype=torch.float64), None
        if on_device:
            values = torch.stack([self._open[keys[i]].double() for i in on_device])
            host = torch.empty(len(on_device), dtype=torch.float64, pin_memory=True)
            host.copy_(values, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        self._pending.append(_Pending(iteration, keys, on_device, host, event, read))
        self._open = {}

    def __len__(self) -> int:
        return len(self._pending)

    def drain(self, before: Optional[int] = None) -> List[Tuple[int, Values]]:
        """The sealed iterations (those before ``before`` only, if given), oldest first,
        waiting for copies still running.

        ``before`` = the current iteration hands over the previous one: its copy has
        normally finished (the GPU is on the current step), so this does not wait, and
        what is handed over depends on the iteration only, never on timing: every rank
        of a job sees the same values at the same iteration (a guard stops all ranks
        together) and a CPU run behaves as a GPU run.
        """
        out = []
        while self._pending and (before is None or self._pending[0].iteration < before):
            pending = self._pending.popleft()
            if pending.event is not None:
                pending.event.synchronize()
            out.append(self._read(pending))
        return out

    @staticmethod
    def _read(pending: _Pending) -> Tuple[int, Values]:
        values = dict(pending.read)
        values.update(zip(pending.on_device, pending.host.tolist()))
        return pending.iteration, {k: values[i] for i, k in enumerate(pending.keys)}
