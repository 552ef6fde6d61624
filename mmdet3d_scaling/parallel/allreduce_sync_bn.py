"""Synchronised BatchNorm with one all-reduce per layer and no host synchronisation.

``torch.nn.SyncBatchNorm`` drops the statistics of empty inputs with a boolean mask in
every forward (``count_all[mask]``), which makes the CPU wait for the GPU once per
BatchNorm layer. Host-bound detectors with dozens of BN layers (PV-RCNN's point and RoI
stages) then lose the CPU / GPU overlap on every layer. mmdet3d's ``naiveSyncBN`` has no
such wait but weights every rank equally, which is wrong when ranks hold different
numbers of elements (the voxels of a sparse encoder differ per rank).

This layer all-reduces ``[sum, sum of squares, count]`` per channel in one collective,
so the statistics are those of the union of all ranks' elements (an empty rank adds
nothing); the backward pass all-reduces two per-channel sums and gives the exact
gradients. Only the input is kept for the backward pass, as in BatchNorm. It works
over NCCL and gloo.
"""
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch.nn.modules.batchnorm import _BatchNorm


def _channel_view(t: torch.Tensor, dim: int) -> torch.Tensor:
    """(C,) -> (1, C, 1, ...) for broadcasting against a (N, C, *) tensor of ``dim``."""
    return t.view([1, -1] + [1] * (dim - 2))


class _SyncBatchNormFunction(torch.autograd.Function):
    """Normalise with statistics summed over ranks; hand-written backward.

    Saves only the input and per-channel statistics (autograd through the elementwise
    ops would keep two more input-sized tensors per layer until the backward pass).
    Forward all-reduces ``[sum, sum of squares, count]``, backward all-reduces
    ``[sum dy, sum dy * x_hat]``: the gradients of BatchNorm over the union of the
    ranks' elements.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: Optional[torch.Tensor],
                bias: Optional[torch.Tensor], eps: float) -> torch.Tensor:
        dims = [0] + list(range(2, x.dim()))
        xf = x.float()  # statistics in fp32, also under AMP
        count = xf.new_full((1,), xf.numel() // xf.shape[1])
        stats = torch.cat([xf.sum(dims), xf.square().sum(dims), count])
        dist.all_reduce(stats)
        channels = x.shape[1]
        total = stats[-1]
        mean = stats[:channels] / total
        var = (stats[channels:2 * channels] / total - mean * mean).clamp_min(0)
        invstd = torch.rsqrt(var + eps)
        out = (xf - _channel_view(mean, x.dim())) * _channel_view(invstd, x.dim())
        if weight is not None:
            out = out * _channel_view(weight.float(), x.dim()) + _channel_view(
                bias.float(), x.dim())
        ctx.save_for_backward(x, weight, mean, invstd, total)
        ctx.mark_non_differentiable(mean, var, total)
        return out.to(x.dtype), mean, var, total

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor, *unused: Any):
        x, weight, mean, invstd, total = ctx.saved_tensors
        dims = [0] + list(range(2, x.dim()))
        dy = grad_out.float()
        x_hat = (x.float() - _channel_view(mean, x.dim())) * _channel_view(invstd, x.dim())
        local = torch.cat([dy.sum(dims), (dy * x_hat).sum(dims)])
        grad_bias, grad_weight = local.chunk(2)  # this rank's share, as in BatchNorm
        sums = local.clone()
        dist.all_reduce(sums)
        sum_dy, sum_dy_xhat = sums.chunk(2)
        scale = invstd if weight is None else invstd * weight.float()
        grad_x = (dy - _channel_view(sum_dy / total, x.dim())
                  - x_hat * _channel_view(sum_dy_xhat / total, x.dim()))
        grad_x = (grad_x * _channel_view(scale, x.dim())).to(x.dtype)
        if weight is None:
            return grad_x, None, None, None
        return (grad_x, grad_weight.to(weight.dtype), grad_bias.to(weight.dtype), None)


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
            return super().forward(input)
        out, mean, var, total = _SyncBatchNormFunction.apply(
            input, self.weight if self.affine else None,
            self.bias if self.affine else None, self.eps)
        if self.track_running_stats and self.running_mean is not None:
            self._update_running_stats(mean, var, total)
        return out

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
