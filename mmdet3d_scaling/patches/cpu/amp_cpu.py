"""mmengine 0.10.x: ``AmpOptimWrapper`` on a machine without GPU/NPU/MLU/MUSA.

``AmpOptimWrapper.__init__`` asserts that an accelerator is present, so ``--amp``, an
``fp16`` key or ``optim_wrapper.type='AmpOptimWrapper'`` abort on a CPU-only machine,
although torch autocasts on the CPU in bfloat16. On such a machine the patch replaces
the assertion by a logged degradation:

- requested ``dtype`` float16 or None -> bfloat16 autocast on the CPU (mmengine's CPU
  autocast supports only bfloat16);
- ``dtype='bfloat16'`` -> bfloat16 autocast;
- ``dtype='float32'`` / ``'float64'`` -> no autocast (plain fp32);
- loss scaling is off (a disabled ``GradScaler``): bfloat16 has float32's exponent
  range, so there is nothing to rescue from underflow. ``loss_scale`` is still checked.

Machines with an accelerator are not touched (``apply()`` returns False).
"""
import logging
from contextlib import contextmanager
from typing import Any, List, Optional, Union

import torch

from ..patching import Change, Patch, declare

UPSTREAM = 'mmengine>=0.10,<0.11'


def accelerator_available() -> bool:
    """Whether mmengine's AmpOptimWrapper would accept this machine as it is."""
    from mmengine.device import (is_cuda_available, is_mlu_available,
                                 is_musa_available, is_npu_available)
    return (is_cuda_available() or is_npu_available() or is_mlu_available()
            or is_musa_available())


def cpu_autocast_dtype(requested: Union[str, torch.dtype, None]) -> Optional[torch.dtype]:
    """The autocast dtype used on the CPU for a requested one (None: no autocast)."""
    if isinstance(requested, str):
        valid = ('float16', 'bfloat16', 'float32', 'float64')
        if requested not in valid:
            raise ValueError(f'AmpOptimWrapper dtype must be one of {valid}, got '
                             f'{requested!r}.')
        requested = getattr(torch, requested)
    if requested in (None, torch.float16, torch.bfloat16):
        return torch.bfloat16
    if requested in (torch.float32, torch.float64):
        return None
    raise ValueError(f'AmpOptimWrapper dtype must be a floating torch.dtype, got '
                     f'{requested!r}.')


def _check_loss_scale(loss_scale: Any) -> None:
    if not (loss_scale == 'dynamic' or isinstance(loss_scale, (float, dict))):
        raise TypeError('loss_scale must be of type float, dict, or "dynamic", but got '
                        f'{loss_scale!r}')


def _cpu_init(self, loss_scale: Any = 'dynamic',
              dtype: Union[str, torch.dtype, None] = None,
              use_fsdp: bool = False, **kwargs) -> None:
    from mmengine.logging import print_log
    from mmengine.optim import OptimWrapper
    OptimWrapper.__init__(self, **kwargs)
    _check_loss_scale(loss_scale)
    self._scale_update_param = None
    self.loss_scaler = torch.amp.GradScaler('cpu', enabled=False)
    self.cast_dtype = cpu_autocast_dtype(dtype)
    mode = 'bfloat16 autocast' if self.cast_dtype is not None else 'plain float32'
    print_log(
        f'AmpOptimWrapper: no GPU/NPU/MLU/MUSA device, so mixed precision runs as '
        f'{mode} on the CPU (requested dtype: {dtype or "float16"}; loss scaling '
        f'{loss_scale!r} is not needed and is off). Set optim_wrapper.dtype='
        "'float32' for plain fp32.", logger='current', level=logging.WARNING)


@contextmanager
def _cpu_optim_context(self, model: torch.nn.Module):
    from mmengine.optim import OptimWrapper
    with OptimWrapper.optim_context(self, model):  # no_sync during accumulation
        with torch.autocast('cpu', dtype=torch.bfloat16,
                            enabled=self.cast_dtype is not None):
            yield


def _changes() -> List[Change]:
    from mmengine.optim import AmpOptimWrapper
    return [Change(AmpOptimWrapper, '__init__', _cpu_init),
            Change(AmpOptimWrapper, 'optim_context', _cpu_optim_context)]


PATCH = declare(Patch(
    name='amp_cpu', kind='cpu',
    targets=('mmengine.optim.AmpOptimWrapper.__init__',
             'mmengine.optim.AmpOptimWrapper.optim_context'),
    upstream=UPSTREAM, changes=_changes, needed=lambda: not accelerator_available(),
    why='AmpOptimWrapper asserts a GPU: on a CPU, bf16 autocast (or fp32), logged'))
