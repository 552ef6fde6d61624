"""spconv 2.3.x on a CPU-only torch: make sparse-conv backward work.

spconv's ``get_current_stream()`` returns ``torch.cuda.current_stream().cuda_stream``
unconditionally. Forward on CPU tensors never calls it, but backward does, and on a
CPU-only torch the call raises ("Torch not compiled with CUDA enabled"). On such a
torch there is no CUDA stream to wait on, so stream 0 (spconv's "no stream") is right.
The shim only replaces the function when torch has no CUDA, and only in the spconv
modules that imported it by name.
"""
import importlib

import torch

UPSTREAM = 'spconv 2.3.x'
_MODULES = ('spconv.pytorch.cppcore', 'spconv.pytorch.ops', 'spconv.pytorch.hash',
            'spconv.pytorch.utils')


def cpu_current_stream() -> int:
    """The stream handle spconv should use when torch has no CUDA: 0 (no stream)."""
    return 0


def apply() -> bool:
    """Patch spconv if installed and torch has no CUDA. Returns whether it patched."""
    if torch.cuda.is_available():
        return False
    try:
        modules = [importlib.import_module(name) for name in _MODULES]
    except ImportError:
        return False
    for module in modules:
        if hasattr(module, 'get_current_stream'):
            module.get_current_stream = cpu_current_stream
    return True
