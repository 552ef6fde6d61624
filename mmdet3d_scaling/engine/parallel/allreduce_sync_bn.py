"""Synchronised BatchNorm with one all-reduce per layer and no host synchronisation.

``torch.nn.SyncBatchNorm`` drops the statistics of empty inputs with a boolean mask in
every forward (``count_all[mask]``), which makes the CPU wait for the GPU once per
BatchNorm layer. Host-bound detectors with dozens of BN layers (PV-RCNN's point and RoI
stages) then lose the CPU / GPU overlap on every layer. mmdet3d's ``naiveSyncBN`` has no
such wait but weights every rank equally, which is wrong when ranks hold different
numbers of elements (the voxels of a sparse encoder differ per rank).

This layer all-reduces ``[sum, sum of squares, count]`` per channel in one collective,
so the statistics are those of the union of all ranks' elements (an empty rank adds
nothing), and autograd's backward of the same all-reduce gives the exact gradients.
It works over NCCL and gloo.
"""
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm


class _AllReduceSum(torch.autograd.Function):
    """Sum over ranks; the gradient of a sum is the sum of the gradients."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.clone()
        dist.all_reduce(tensor)
        return tensor

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class AllReduceSyncBatchNorm(_BatchNorm):
    """BatchNorm over all ranks' elements for inputs of shape (N, C, *).

    Args: as :class:`torch.nn.BatchNorm1d` (``num_features``, ``eps`` = 1e-5,
    ``momentum`` = 0.1, ``affine``, ``track_running_stats``). Outside training, or in a
    single process, it is a plain BatchNorm.
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f'AllReduceSyncBatchNorm expects (N, C, *) input, got shape '
                             f'{tuple(input.shape)}')

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        synced = (self.training and dist.is_available() and dist.is_initialized()
                  and dist.get_world_size() > 1)
        if not synced:
            return self._local(input)
        dims = [0] + list(range(2, input.dim()))
        x = input.float()  # statistics in fp32, also under AMP
        count = x.new_full((1,), x.numel() // x.shape[1])
        stats = _AllReduceSum.apply(
            torch.cat([x.sum(dims), (x * x).sum(dims), count]))
        channels = x.shape[1]
        total = stats[-1]
        mean = stats[:channels] / total
        var = (stats[channels:2 * channels] / total - mean * mean).clamp_min(0)
        if self.track_running_stats and self.running_mean is not None:
            self._update_running_stats(mean.detach(), var.detach(), total.detach())
        shape = [1, channels] + [1] * (input.dim() - 2)
        out = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out.to(input.dtype)

    def _local(self, input: torch.Tensor) -> torch.Tensor:
        return super().forward(input)

    @torch.no_grad()
    def _update_running_stats(self, mean: torch.Tensor, var: torch.Tensor,
                              total: torch.Tensor) -> None:
        self.num_batches_tracked.add_(1)
        if self.momentum is None:  # cumulative moving average, as torch's BatchNorm
            factor = 1.0 / self.num_batches_tracked.to(self.running_mean.dtype)
        else:
            factor = self.momentum
        unbiased = var * total / (total - 1).clamp_min(1)  # no host sync: stays on device
        self.running_mean.lerp_(mean.to(self.running_mean.dtype), factor)
        self.running_var.lerp_(unbiased.to(self.running_var.dtype), factor)
