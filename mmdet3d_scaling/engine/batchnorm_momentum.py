"""BatchNorm running statistics per optimizer step under gradient accumulation.

BatchNorm updates its running mean / variance on every forward pass in training mode:
``stat <- (1 - m) * stat + m * batch_stat``. With K accumulated micro-batches per
optimizer step that is K updates a step where the same recipe without accumulation
(K GPUs, or one GPU with a K times larger batch) makes one, so the running average
spans K times fewer optimizer steps. The model's weights are the same after a step;
the statistics used at evaluation are not (docs/parity.md measures it).

``scaling.bn_momentum='per_step'`` (the recipe's default) reads the model's momentum
``m`` as the value *per optimizer step* and gives every forward pass
``m' = 1 - (1 - m) ** (1 / K)``: K updates then move the average exactly as far as one
update with ``m`` (``(1 - m') ** K = 1 - m``). ``'per_forward'`` keeps the modules'
momentum per forward pass (PyTorch's and mmengine's behaviour).

With several processes each rank runs K = the plan's accumulation forward passes a
step; DDP broadcasts rank 0's buffers (``broadcast_buffers``), so rank 0's running
statistics, updated K times a step, are the model's. Layers with ``momentum=None``
(a cumulative average) or without running statistics are left alone.
"""
from typing import Dict, Iterator, List, Tuple

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


def per_forward_momentum(momentum: float, accumulation: int) -> float:
    """Momentum per forward pass that gives ``momentum`` per ``accumulation`` passes."""
    if accumulation < 1:
        raise ValueError(f'accumulation must be >= 1, got {accumulation}')
    return 1.0 - (1.0 - momentum) ** (1.0 / accumulation)


def batchnorm_layers(model: nn.Module) -> Iterator[Tuple[str, _BatchNorm]]:
    """BatchNorm layers (any dimension, SyncBN included) that keep an exponential
    running average: ``track_running_stats`` and a numeric ``momentum``."""
    for name, module in model.named_modules():
        if (isinstance(module, _BatchNorm) and module.track_running_stats
                and module.momentum is not None):
            yield name, module


def record_momenta(model: nn.Module) -> Dict[str, float]:
    """Each layer's momentum as built from the config (the per-step values)."""
    return {name: float(layer.momentum) for name, layer in batchnorm_layers(model)}


def set_momenta(model: nn.Module, per_step: Dict[str, float], accumulation: int) -> int:
    """Give each recorded layer the per-forward momentum for ``accumulation``; returns
    the number of layers set. Always computed from ``per_step``, so a new plan at run
    time (auto batch size) does not compound conversions."""
    count = 0
    for name, layer in batchnorm_layers(model):
        if name in per_step:
            layer.momentum = per_forward_momentum(per_step[name], accumulation)
            count += 1
    return count


def describe(per_step: Dict[str, float], accumulation: int) -> str:
    """One log line: layers, per-step momenta and what a forward pass uses now."""
    values: List[float] = sorted(set(per_step.values()))
    pairs = ', '.join(f'{m:g} -> {per_forward_momentum(m, accumulation):.6g}'
                      for m in values)
    return (f"scaling.bn_momentum='per_step': {len(per_step)} BatchNorm layer(s), "
            f'momentum per optimizer step -> per forward pass of {accumulation} '
            f'accumulated micro-batches: {pairs}')
