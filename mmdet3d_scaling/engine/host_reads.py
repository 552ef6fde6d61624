"""Which Python lines read GPU values back to the CPU, counted on any device.

A host read (``.item()``, ``if tensor:``, ``nonzero``, boolean-mask indexing, ``.cpu()``)
on a CUDA tensor makes the CPU wait until the GPU has caught up. :class:`HostReadCensus`
counts the calls that would be such reads by their Python call site, through a
``TorchFunctionMode``, so it also runs on a CPU-only machine: the list of places to fix
in a host-bound model, and a count to compare before and after a change.

What it sees: torch calls made from Python. Not: reads inside C++ / CUDA extensions
(mmcv, spconv kernels), which only a GPU profile shows (``host_syncs_per_iter`` of
``tools/benchmark_scaling.py --profile-steps``). On a CPU it cannot tell a tensor that
would live on the GPU from one that lives on the CPU anyway, so frames known to handle
CPU-side tensors on a GPU too (the optimizer's step counters, gradient clipping) and the
plugin's CPU twins of CUDA-only ops are left out (``DEFAULT_EXCLUDE``).
"""
import traceback
from collections import Counter
from typing import Any, Dict, List, Sequence

import torch
from torch.overrides import TorchFunctionMode

# Tensor methods / torch functions that read a value (or a data-dependent size) back.
READ_OPS = frozenset({
    'item', 'tolist', 'cpu', 'numpy', 'nonzero', 'argwhere', 'masked_select', 'unique',
    'unique_consecutive', '__bool__', '__int__', '__float__', '__index__'})
DEFAULT_EXCLUDE = ('/torch/optim/', '/torch/nn/utils/clip_grad',
                   'mmdet3d_scaling/compat/point_ops_cpu.py')
_NOT_A_SITE = ('/torch/', '<built-in')


def _read_name(func: Any, args: tuple, kwargs: dict) -> str:
    """The host read ``func(*args)`` would be on a CUDA tensor, or '' if none."""
    name = getattr(func, '__name__', '')
    if name in READ_OPS:
        return name
    if name == 'where' and len(args) == 1 and not kwargs:
        return 'where(cond)'
    if name == '__getitem__' and len(args) > 1:
        index = args[1] if isinstance(args[1], tuple) else (args[1], )
        if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index):
            return '[bool mask]'
    return ''


class HostReadCensus(TorchFunctionMode):
    """``with HostReadCensus() as census:`` counts would-be host reads by call site.

    Args:
        exclude: substrings of file paths; a read with such a frame on its stack is not
            counted. Defaults to ``DEFAULT_EXCLUDE``.
    """

    def __init__(self, exclude: Sequence[str] = DEFAULT_EXCLUDE):
        super().__init__()
        self.exclude = tuple(exclude)
        self.counts: Counter = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _read_name(func, args, kwargs)
        if name:
            self._record(name)
        return func(*args, **kwargs)

    def _record(self, name: str) -> None:
        frames = traceback.extract_stack()
        if any(x in f.filename for f in frames for x in self.exclude):
            return
        site = next((f'{f.filename}({f.lineno}): {f.name}' for f in reversed(frames)
                     if f.filename != __file__
                     and not any(x in f.filename for x in _NOT_A_SITE)), '<no caller>')
        self.counts[(site, name)] += 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def sites(self, top: int = 20, per: int = 1) -> List[Dict[str, Any]]:
        """The ``top`` call sites, reads per ``per`` calls (e.g. per iteration)."""
        return [dict(site=site, op=op, count=n / max(per, 1))
                for (site, op), n in self.counts.most_common(top)]
