"""How much memory a training step takes: measured on CUDA, or modelled on a CPU.

The batch size finder (:mod:`.search`) only talks to a probe through the
:class:`MemoryProbe` protocol, so its search, margin and OOM handling run unchanged on a
machine without a GPU with :class:`ModeledMemoryProbe` standing in for the device.
"""
import contextlib
from typing import Any, Iterable, Iterator, Optional

import torch
from torch import nn

try:  # a Protocol documents the duck type; nothing checks it at run time
    from typing import Protocol
except ImportError:  # pragma: no cover - Python < 3.8
    Protocol = object  # type: ignore


class MemoryProbe(Protocol):
    """What the finder needs to know about device memory.

    ``reset()`` is called before a trial, ``peak_bytes()`` after it (the most memory the
    trial held at once), ``capacity_bytes()`` is the device's total memory. Inside
    ``with limit(n):`` the device runs out of memory above ``n`` bytes, as it would at
    its capacity: a trial then answers "does this batch train in ``n`` bytes".
    """

    def limit(self, num_bytes: int) -> 'contextlib.AbstractContextManager[None]':
        ...

    def reset(self) -> None:
        ...

    def peak_bytes(self) -> int:
        ...

    def capacity_bytes(self) -> int:
        ...

    def release(self) -> None:
        ...

    def device_name(self) -> str:
        ...


class CudaMemoryProbe:
    """Memory of PyTorch's caching allocator on one CUDA device.

    ``limit(n)`` caps the allocator at ``n`` bytes (``set_per_process_memory_fraction``,
    restored on exit), so a trial runs into the same out-of-memory error training would
    meet on a card of that size, after the allocator has freed its cache and retried.
    That, not a memory figure, is what decides a trial: neither figure is the need.
    The allocated peak understates it (fragmentation): judged by it the finder chose 64
    on an H200 capped at 2 GiB and training ran out of memory at iteration 5. The
    reserved peak overstates it (the allocator keeps freed blocks while it may): judged
    by it the finder chose 51 of the 62 that train on random batches.

    ``peak_bytes`` reports the reserved peak (at most the limit inside ``limit``).

    Args:
        device: CUDA device; defaults to the current one.
    """

    def __init__(self, device: Optional[torch.device] = None):
        if not torch.cuda.is_available():
            raise RuntimeError('CudaMemoryProbe needs a CUDA device; on a CPU-only '
                               'machine use ModeledMemoryProbe.')
        self.device = torch.device('cuda', torch.cuda.current_device()) \
            if device is None else torch.device(device)

    def reset(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak_bytes(self) -> int:
        torch.cuda.synchronize(self.device)
        return int(torch.cuda.max_memory_reserved(self.device))

    def _fraction(self) -> float:
        get_fraction = getattr(torch.cuda, 'get_per_process_memory_fraction', None)
        return float(get_fraction(self.device)) if get_fraction is not None else 1.0

    @contextlib.contextmanager
    def limit(self, num_bytes: int) -> Iterator[None]:
        total = torch.cuda.get_device_properties(self.device).total_memory
        before = self._fraction()
        torch.cuda.set_per_process_memory_fraction(
            min(before, max(num_bytes, 0) / total), self.device)
        try:
            yield
        finally:
            torch.cuda.set_per_process_memory_fraction(before, self.device)

    def capacity_bytes(self) -> int:
        total = torch.cuda.get_device_properties(self.device).total_memory
        # A cap set with torch.cuda.set_per_process_memory_fraction is the real limit.
        return int(total * min(self._fraction(), 1.0))

    def release(self) -> None:
        torch.cuda.empty_cache()

    def device_name(self) -> str:
        return torch.cuda.get_device_name(self.device)


def _tensor_elements(obj: Any) -> int:
    """Number of tensor elements in a nested structure of dicts / sequences / tensors."""
    if isinstance(obj, torch.Tensor):
        return obj.numel()
    if isinstance(obj, dict):
        return sum(_tensor_elements(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_elements(v) for v in obj)
    return 0


def _state_bytes(model: nn.Module, optimizers: Iterable[torch.optim.Optimizer]) -> int:
    """Bytes held by parameters, their gradients and the optimizer state right now."""
    total = 0
    for p in model.parameters():
        total += p.numel() * p.element_size()
        if p.grad is not None:
            total += p.grad.numel() * p.grad.element_size()
    for opt in optimizers:
        for state in opt.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    total += v.numel() * v.element_size()
    return total


def _count_samples(args: tuple, kwargs: dict) -> int:
    """Samples in one forward call: ``data_samples`` (mmdet3d), else a tensor's first
    dimension or a list's length in the inputs."""
    samples = kwargs.get('data_samples')
    if samples is None and len(args) > 1:
        samples = args[1]
    if isinstance(samples, (list, tuple)):
        return len(samples)
    inputs = kwargs.get('inputs', args[0] if args else None)
    if isinstance(inputs, dict):
        inputs = next(iter(inputs.values()), None)
    if isinstance(inputs, torch.Tensor) and inputs.dim() > 0:
        return int(inputs.shape[0])
    if isinstance(inputs, (list, tuple)):
        return len(inputs)
    return 0


class ModeledMemoryProbe:
    """A stand-in for a GPU whose memory use is modelled from the real trial.

    memory = fixed + ``bytes_per_sample`` x samples + ``bytes_per_element`` x elements,
    where, for the largest ``forward`` call of the trial, samples is the batch size and
    elements the number of tensor elements reaching ``forward`` (points, voxels, images
    after the data preprocessor), so bigger point clouds cost more as on a GPU. fixed is
    ``fixed_bytes`` or, when None, the bytes of parameters, gradients and optimizer state
    measured at the end of the trial.

    When a forward call would need more than ``oom_bytes`` (or the ``limit`` in force),
    it raises ``torch.cuda.OutOfMemoryError`` like the CUDA allocator does, inside the
    trial.

    Args:
        model: the module whose ``forward`` inputs are counted (the unwrapped model).
        capacity_bytes: device memory to report, bytes.
        bytes_per_sample: modelled bytes per sample. Defaults to 0.
        bytes_per_element: modelled bytes per input tensor element. Defaults to 0.
        fixed_bytes: constant part in bytes; None measures the training state.
            Defaults to None.
        oom_bytes: raise an out-of-memory error above this many bytes; defaults to
            ``capacity_bytes`` (a real device fails at its capacity).
        optimizers: optimizers whose state counts towards the measured fixed part.
        name: device name reported for caching. Defaults to 'modeled-cpu'.
    """

    def __init__(self, model: nn.Module, capacity_bytes: int,
                 bytes_per_sample: float = 0.0, bytes_per_element: float = 0.0,
                 fixed_bytes: Optional[int] = None, oom_bytes: Optional[int] = None,
                 optimizers: Iterable[torch.optim.Optimizer] = (),
                 name: str = 'modeled-cpu'):
        if capacity_bytes <= 0:
            raise ValueError(f'capacity_bytes must be > 0, got {capacity_bytes}')
        if bytes_per_sample < 0 or bytes_per_element < 0:
            raise ValueError('bytes_per_sample and bytes_per_element must be >= 0, got '
                             f'{bytes_per_sample} and {bytes_per_element}')
        self.model = model
        self._capacity = int(capacity_bytes)
        self.bytes_per_sample = float(bytes_per_sample)
        self.bytes_per_element = float(bytes_per_element)
        self.fixed_bytes = fixed_bytes
        self.oom_bytes = self._capacity if oom_bytes is None else int(oom_bytes)
        self.optimizers = list(optimizers)
        self.name = name
        self._peak_call = (0, 0)  # (samples, elements) of the costliest forward call
        self._handle = model.register_forward_pre_hook(self._count, with_kwargs=True)

    def modeled_bytes(self, samples: int, elements: int) -> int:
        fixed = self.fixed_bytes
        if fixed is None:
            fixed = _state_bytes(self.model, self.optimizers)
        return int(fixed + self.bytes_per_sample * samples
                   + self.bytes_per_element * elements)

    def _count(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        call = (_count_samples(args, kwargs), _tensor_elements(args)
                + _tensor_elements(kwargs))
        need = self.modeled_bytes(*call)
        if need > self.modeled_bytes(*self._peak_call):
            self._peak_call = call
        if need > self.oom_bytes:
            raise torch.cuda.OutOfMemoryError(
                f'CUDA out of memory (modelled): the step needs {need} bytes, '
                f'the modelled device holds {self.oom_bytes}.')

    def reset(self) -> None:
        self._peak_call = (0, 0)

    @contextlib.contextmanager
    def limit(self, num_bytes: int) -> Iterator[None]:
        before = self.oom_bytes
        self.oom_bytes = min(before, int(num_bytes))
        try:
            yield
        finally:
            self.oom_bytes = before

    def peak_bytes(self) -> int:
        return self.modeled_bytes(*self._peak_call)

    def capacity_bytes(self) -> int:
        return self._capacity

    def release(self) -> None:
        pass

    def device_name(self) -> str:
        return self.name

    def detach(self) -> None:
        """Remove the forward hook from the model."""
        self._handle.remove()


class ModeledCheckpointingProbe(ModeledMemoryProbe):
    """:class:`ModeledMemoryProbe` whose per-sample bytes depend on the gradient
    checkpointing in force (CPU runs and tests of the fastest fit).

    Args:
        switch_model: the module whose ``with_cp`` flags / ``checkpoint_modules`` say
            whether checkpointing is on; defaults to ``model``.
        checkpointed_bytes_per_sample: bytes per sample while any is on. Defaults to
            ``bytes_per_sample`` (checkpointing saves nothing).
        **kwargs: :class:`ModeledMemoryProbe`'s arguments.
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

