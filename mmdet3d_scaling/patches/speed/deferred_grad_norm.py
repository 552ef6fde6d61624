"""mmengine 0.10: norm clipping reads the gradient norm on the host at every step.

``OptimWrapper._clip_grad`` logs ``float(grad)``; on CUDA that read waits for the GPU
to finish the backward pass and the clipping (the BEVFusion step's ``optimizer.step``
stage: 55.9 ms of ``cudaStreamSynchronize`` on an H200, docs/benchmarks.md). With this
patch the clipping is mmengine's own (the same ``clip_func`` and arguments, so the same
gradients); only where the norm goes changes: to the run's
:class:`~mmdet3d_scaling.monitoring.deferred_scalars.DeferredScalars` when the message
hub holds one (``AsyncRuntimeInfoHook``, config key ``async_logging=True``), which puts
it into the message hub as ``train/grad_norm`` once on the host. Without a sink it logs
as upstream does. Selected by ``async_logging`` (by name, not by the ``speed`` set).
Tested in ``tests/patches/speed/test_deferred_grad_norm.py``.
"""
import dataclasses
from typing import List

import torch

from ...monitoring.deferred_scalars import SINK_INFO
from ..patching import declare, method_patch

UPSTREAM = 'mmengine>=0.10,<0.11'


def _clip_grad(self) -> None:
    """mmengine's ``_clip_grad``; the norm is handed to the run's sink if it has one."""
    sink = self.message_hub.get_info(SINK_INFO)
    if sink is None:
        return _clip_grad.original(self)
    params: List[torch.Tensor] = [p for group in self.optimizer.param_groups
                                  for p in group['params']]
    params = [p for p in params if p.requires_grad and p.grad is not None]
    if not params:
        return None
    grad = self.clip_func(params, **self.clip_grad_kwargs)
    if grad is not None:  # clip_grad_value_ returns None
        sink.add(f'train/{self.grad_name}', grad)
    return None


PATCH = declare(dataclasses.replace(method_patch(
    'deferred_grad_norm', 'speed', 'mmengine.optim:OptimWrapper', '_clip_grad',
    _clip_grad, UPSTREAM,
    why='norm clipping reads the gradient norm with float() each step (a wait for the '
        'GPU): handed to the async log reads of async_logging instead'), in_set=False))
