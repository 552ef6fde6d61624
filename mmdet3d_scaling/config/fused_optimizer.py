"""``optim_wrapper.optimizer.fused=True``: torch's fused optimizer step, checked.

torch's ``Adam``, ``AdamW``, ``SGD`` and ``Adagrad`` take ``fused=True``: one kernel
updates every parameter of a group, and on a GPU the step counters live there. The
default multi-tensor step reads each parameter's counter on the host (two ``.item()``
a parameter: the 792 host reads of BEVFusion's ``optimizer.step`` stage, 396
parameters) and launches a few dozen kernels; fp16's GradScaler reads ``found_inf``
before it lets the step run, while a fused step takes ``found_inf`` as a device tensor
and skips itself. The updates agree
with the default step to float rounding (``tests/config/test_fused_optimizer.py``).

The key is torch's own and mmengine passes it through; this step only checks it where a
mistake would surface later or obscurely, and says at start-up that the step is fused:

- an optimizer type without a fused step (mmengine would fail with ``unexpected keyword
  argument 'fused'``);
- ``foreach=True`` with it (torch refuses the pair when the optimizer is built);
- a CPU run on a torch without the fused CPU kernels (torch < 2.4), probed on a
  one-element parameter. CUDA is not probed: the config is prepared before each rank
  has its device, so a probe would put a context of every rank on GPU 0.
"""
import inspect
from typing import Optional

import torch
from mmengine.config import Config
from mmengine.registry import OPTIMIZERS

KEY = 'optim_wrapper.optimizer.fused'


def _optimizer_class(kind) -> type:
    """The optimizer class a config's ``type`` names (a name or the class itself)."""
    cls = OPTIMIZERS.get(kind) if isinstance(kind, str) else kind
    if not isinstance(cls, type):
        raise ValueError(f'{KEY}=True: optimizer type {kind!r} is not registered in '
                         "mmengine's OPTIMIZERS; check optim_wrapper.optimizer.type.")
    return cls


def _probe_cpu(cls: type, options: dict) -> None:
    """Build ``cls`` with ``options`` for a one-element CPU parameter, or a ValueError."""
    param = torch.zeros(1, requires_grad=True)
    try:
        cls([param], **options)
    except (RuntimeError, ValueError) as err:
        raise ValueError(
            f'{KEY}=True: torch {torch.__version__} has no fused {cls.__name__} step for '
            f'CPU parameters ({err}). Run on a GPU, use torch >= 2.4, or set '
            f'{KEY}=False.') from err


def check_fused_optimizer(cfg: Config) -> Optional[str]:
    """The start-up line of a config that asks for a fused optimizer step (None when it
    does not), or a ValueError naming what cannot work."""
    optimizer = (cfg.get('optim_wrapper') or {}).get('optimizer') or {}
    if not optimizer.get('fused'):
        return None
    cls = _optimizer_class(optimizer.get('type'))
    if 'fused' not in inspect.signature(cls.__init__).parameters:
        raise ValueError(
            f'{KEY}=True: {cls.__name__} has no fused step (torch has one for Adam, '
            f'AdamW, SGD and Adagrad); remove the key or use one of those.')
    if optimizer.get('foreach'):
        raise ValueError(f'{KEY}=True and optim_wrapper.optimizer.foreach=True: torch '
                         'takes one of the two; remove foreach.')
    if not torch.cuda.is_available():
        _probe_cpu(cls, {k: v for k, v in optimizer.items() if k != 'type'})
    return (f'optimizer step: fused {cls.__name__} ({KEY}=True: one kernel a parameter '
            'group and device; on a GPU no host reads of its step counters)')
