"""BatchNorm -> synchronised BatchNorm, sparse encoders included, on GPU or CPU.

What mmengine's ``convert_sync_batchnorm`` leaves out:

- spconv's ``SparseBatchNorm`` (takes a ``SparseConvTensor``) became a plain
  ``SyncBatchNorm`` that cannot; it now becomes spconv's ``SparseSyncBatchNorm``;
- layers that already synchronise (mmdet3d's ``naiveSyncBN1d/2d``, mmcv's ``MMSyncBN``)
  were rebuilt as torch ``SyncBatchNorm``; they are now kept;
- ``torch.nn.SyncBatchNorm`` and mmcv's ``SyncBatchNorm`` only train on GPUs. On a
  machine without CUDA the 'naive' implementation (mmdet3d's all-reduce BatchNorm, works
  over gloo) is used instead of failing in the first forward.

The BatchNorm1d layers inside mmdet3d's ``SparseEncoder`` live in spconv
``SparseSequential`` containers; the recursion below goes through ``named_children`` so
it reaches them (``tests/parallel/test_sync_bn.py`` checks on a real encoder).
"""
import functools
from collections import Counter
from typing import Any, Dict, Optional, Sequence, Type

import torch
from mmengine.logging import print_log
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from .allreduce_sync_bn import AllReduceSyncBatchNorm

IMPLEMENTATIONS = ('torch', 'mmcv', 'naive', 'allreduce')
# Implementations that train without CUDA (over gloo).
CPU_CAPABLE = ('naive', 'allreduce')


def _spconv_classes():
    try:
        from spconv.pytorch.modules import SparseBatchNorm, SparseSyncBatchNorm
    except ImportError:  # spconv missing: no sparse BN layers to care about
        return None, None
    return SparseBatchNorm, SparseSyncBatchNorm


def _already_synced_types() -> tuple:
    types = [nn.SyncBatchNorm, AllReduceSyncBatchNorm]
    from mmdet3d.models.layers.norm import NaiveSyncBatchNorm1d, NaiveSyncBatchNorm2d
    types += [NaiveSyncBatchNorm1d, NaiveSyncBatchNorm2d]
    try:
        from mmcv.ops import SyncBatchNorm as MMCVSyncBatchNorm
        types.append(MMCVSyncBatchNorm)
    except ImportError:
        pass
    return tuple(types)


@functools.lru_cache(maxsize=None)
def _sparse_class(implementation: str) -> Type[nn.Module]:
    """The 'naive' / 'allreduce' BatchNorm1d that also accepts a ``SparseConvTensor``."""
    import spconv.pytorch as spconv
    if implementation == 'naive':
        from mmdet3d.models.layers.norm import NaiveSyncBatchNorm1d as base
    else:
        base = AllReduceSyncBatchNorm

    def forward(self, input):
        if isinstance(input, spconv.SparseConvTensor):
            return input.replace_feature(base.forward(self, input.features))
        return base.forward(self, input)

    return type(f'Sparse{base.__name__}', (base, ), dict(forward=forward))


def _target_class(bn: _BatchNorm, implementation: str) -> Optional[Type[nn.Module]]:
    """The synchronised class for one layer; None: no synchronised form exists."""
    sparse_bn, sparse_sync_bn = _spconv_classes()
    if sparse_bn is not None and isinstance(bn, sparse_bn):
        if implementation in CPU_CAPABLE:
            return _sparse_class(implementation)
        return sparse_sync_bn
    if implementation == 'allreduce':
        return AllReduceSyncBatchNorm
    if implementation == 'torch':
        return nn.SyncBatchNorm
    if implementation == 'mmcv':
        from mmcv.ops import SyncBatchNorm as MMCVSyncBatchNorm
        return MMCVSyncBatchNorm
    from mmdet3d.models.layers.norm import NaiveSyncBatchNorm1d, NaiveSyncBatchNorm2d
    if isinstance(bn, nn.BatchNorm1d):
        return NaiveSyncBatchNorm1d
    if isinstance(bn, nn.BatchNorm2d):
        return NaiveSyncBatchNorm2d
    return None  # BatchNorm3d: mmdet3d has no naive 3D form


def _convert_layer(bn: _BatchNorm, cls: Type[nn.Module]) -> nn.Module:
    new = cls(bn.num_features, bn.eps, bn.momentum, bn.affine, bn.track_running_stats)
    if bn.affine:
        new.weight, new.bias = bn.weight, bn.bias  # same Parameters: optimizer-safe
    if bn.track_running_stats:
        new.running_mean, new.running_var = bn.running_mean, bn.running_var
        new.num_batches_tracked = bn.num_batches_tracked
    new.train(bn.training)
    if hasattr(bn, 'qconfig'):
        new.qconfig = bn.qconfig
    return new


def resolve_implementation(requested: str, cuda: Optional[bool] = None) -> str:
    """Validate ``requested``; without CUDA, 'torch'/'mmcv' become 'naive' (with a note)."""
    if requested not in IMPLEMENTATIONS:
        raise ValueError(f'sync_bn={requested!r} is not one of {", ".join(IMPLEMENTATIONS)}'
                         " ('allreduce': exact, no host sync, also works on CPU).")
    cuda = torch.cuda.is_available() if cuda is None else cuda
    if not cuda and requested not in CPU_CAPABLE:
        print_log(f'sync_bn={requested!r} needs CUDA to train; without a GPU the '
                  "'naive' all-reduce SyncBN (gloo-capable) is used instead.",
                  logger='current')
        return 'naive'
    return requested


def _in_scope(name: str, scope: Optional[Sequence[str]]) -> bool:
    return scope is None or any(name == s or name.startswith(s + '.') for s in scope)


def check_scope_format(scope: Any) -> None:
    """``scope`` must be None or a non-empty list / tuple of non-empty names."""
    if scope is None:
        return
    if not isinstance(scope, (list, tuple)) or not scope or not all(
            isinstance(s, str) and s for s in scope):
        raise ValueError('sync_bn_scope must be None or a non-empty list of submodule '
                         f"names (e.g. ['backbone', 'middle_encoder']), got {scope!r}")


def check_scope(module: nn.Module, scope: Optional[Sequence[str]]) -> None:
    """Every entry of ``scope`` must name a submodule holding a BatchNorm layer."""
    check_scope_format(scope)
    if scope is None:
        return
    bn_names = [n for n, m in module.named_modules() if isinstance(m, _BatchNorm)]
    missing = [s for s in scope if not any(_in_scope(n, [s]) for n in bn_names)]
    if missing:
        children = ', '.join(n for n, _ in module.named_children())
        raise ValueError(f'sync_bn_scope: {missing} hold no BatchNorm layer of this model '
                         f'(its top-level parts: {children}). Name submodules that do, '
                         'or drop sync_bn_scope to synchronise every layer.')


def convert_sync_bn(module: nn.Module, implementation: str = 'torch',
                    scope: Optional[Sequence[str]] = None) -> nn.Module:
    """Replace the BatchNorm layers of ``module`` with synchronised ones (in place for
    children; returns the new root if the root itself is a BatchNorm).

    Args:
        module: model, already on its device.
        implementation: 'torch' (``nn.SyncBatchNorm``), 'mmcv' (``MMSyncBN``),
            'naive' (mmdet3d's ``naiveSyncBN1d/2d``, gloo-capable; ranks weighted
            equally) or 'allreduce' (:class:`AllReduceSyncBatchNorm`: exact statistics,
            one all-reduce per layer, no host synchronisation, gloo-capable).
            BatchNorm3d has no naive form and stays per-process with 'naive' (logged).
        scope: names of submodules (``'backbone'``, ``'roi_head.bbox_head'``) whose
            layers are converted; the rest keep per-process statistics, and their
            ranks do not wait for each other there. None: every layer. Defaults to None.
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f'implementation must be one of {IMPLEMENTATIONS}, '
                         f'got {implementation!r}')
    check_scope(module, scope)
    synced = _already_synced_types()
    skipped = []

    def convert(mod: nn.Module, name: str) -> nn.Module:
        if isinstance(mod, _BatchNorm) and not isinstance(mod, synced) \
                and _in_scope(name, scope):
            cls = _target_class(mod, implementation)
            if cls is None:
                skipped.append(name or type(mod).__name__)
            else:
                mod = _convert_layer(mod, cls)
        for child_name, child in list(mod.named_children()):
            mod.add_module(child_name,
                           convert(child, f'{name}.{child_name}' if name else child_name))
        return mod

    root = convert(module, '')
    if skipped:
        print_log(f'sync_bn={implementation!r}: {len(skipped)} layer(s) have no '
                  f'synchronised form and keep per-process statistics: '
                  f'{", ".join(skipped[:10])}{" ..." if len(skipped) > 10 else ""}',
                  logger='current')
    return root


def norm_layer_counts(module: nn.Module) -> Dict[str, int]:
    """How many normalisation layers of each class ``module`` holds (for logs/tests)."""
    return dict(Counter(type(m).__name__ for m in module.modules()
                        if isinstance(m, _BatchNorm) or 'BatchNorm' in type(m).__name__))
