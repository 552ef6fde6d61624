"""spconv 2.3.x on a CPU-only torch: make sparse-conv backward work.

spconv's ``get_current_stream()`` returns ``torch.cuda.current_stream().cuda_stream``
unconditionally. Forward on CPU tensors never calls it, but backward does, and on a
CPU-only torch the call raises ("Torch not compiled with CUDA enabled"). On such a
torch there is no CUDA stream to wait on, so stream 0 (spconv's "no stream") is right.
The patch only replaces the function when torch has no CUDA, and only in the spconv
modules that imported it by name.

Second defect: spconv 2.3.x has no bf16/fp16 kernels on the CPU (``torch_tensor_to_tv``
raises ``KeyError: torch.bfloat16``). Without a GPU, AMP degrades to bf16 autocast (see
``amp_cpu.py``), which hands sparse convolutions bf16 features. On CPU tensors the patch
runs each sparse convolution in fp32 with autocast off; CUDA tensors are untouched.
"""
import functools
import importlib
import importlib.util
from typing import List

import torch

from ..patching import Change, Patch, declare

UPSTREAM = 'spconv>=2.3,<2.4'
_MODULES = ('spconv.pytorch.cppcore', 'spconv.pytorch.ops', 'spconv.pytorch.hash',
            'spconv.pytorch.utils')


def cpu_current_stream() -> int:
    """The stream handle spconv should use when torch has no CUDA: 0 (no stream)."""
    return 0


def _fp32_on_cpu(forward):
    if getattr(forward, '_mmdet3d_scaling_fp32', False):
        return forward

    @functools.wraps(forward)
    def wrapper(self, input, *args, **kwargs):
        features = input.features
        if features.device.type != 'cpu':
            return forward(self, input, *args, **kwargs)
        if features.dtype != torch.float32:
            input = input.replace_feature(features.float())
        with torch.autocast('cpu', enabled=False):
            return forward(self, input, *args, **kwargs)

    wrapper._mmdet3d_scaling_fp32 = True
    return wrapper


def _spconv_installed() -> bool:
    return importlib.util.find_spec('spconv') is not None


def _changes() -> List[Change]:
    conv = importlib.import_module('spconv.pytorch.conv')
    changes = [Change(conv.SparseConvolution, 'forward',
                      _fp32_on_cpu(conv.SparseConvolution.forward))]
    for name in _MODULES:
        module = importlib.import_module(name)
        if hasattr(module, 'get_current_stream'):
            changes.append(Change(module, 'get_current_stream', cpu_current_stream))
    return changes


PATCH = declare(Patch(
    name='spconv_cpu', kind='cpu',
    targets=tuple(f'{m}.get_current_stream' for m in _MODULES)
    + ('spconv.pytorch.conv.SparseConvolution.forward',),
    upstream=UPSTREAM, changes=_changes, needed=_spconv_installed,
    why='sparse-conv backward asks CUDA for a stream on a CPU-only torch; no bf16 CPU '
        'kernels: CPU convolutions run in fp32'))
