"""Every change the plugin makes to upstream code, as declared patches (one a module).

The folder a module sits in is its set: ``fixes/`` (upstream would crash or be unsafe;
applied on ``import mmdet3d_scaling``), ``cpu/`` (CPU twins of CUDA-only code; applied on
import where torch has no CUDA) and ``speed/`` (rewrites with upstream's results; only
when a config says ``patches = ['speed']``). A new patch is one module in its folder that
calls :func:`patching.declare`; the folders are imported here in the order fixes, cpu,
speed, and each folder's modules in name order (``_private`` helpers are skipped).

``python -m mmdet3d_scaling.patches`` prints the table generated from the records
(``--markdown``: the table of ``docs/patches.md``).
"""
import importlib
import pkgutil
from types import ModuleType
from typing import List

from . import mmcv_ops

mmcv_ops.check()  # first: the patch modules import mmdet3d, which needs the ops

from . import patching  # noqa: E402


def _import_folder(name: str) -> List[ModuleType]:
    """Import every public module of the set folder ``name`` in name order."""
    package = importlib.import_module(f'{__name__}.{name}')
    names = sorted(m.name for m in pkgutil.iter_modules(package.__path__)
                   if not m.name.startswith('_'))
    return [importlib.import_module(f'{package.__name__}.{m}') for m in names]


for _kind in patching.KINDS:
    _import_folder(_kind)

__all__ = ['patching', 'mmcv_ops']
