"""mmdet3d 1.4.0 / mmcv 2.1.0: sparse-conv checkpoints load one way only, and by metadata.

mmcv's sparse conv stores a weight as ``[kD, kH, kW, in, out]``, spconv 2.x as
``[out, kD, kH, kW, in]``. mmdet3d (when spconv is installed) replaces spconv's
``SparseModule._load_from_state_dict`` with one that permutes every weight whose
checkpoint metadata lacks ``version == 2``: an mmcv-trained checkpoint loads into spconv,
but a spconv checkpoint whose metadata was dropped (a plain ``dict`` re-saved, converted
or merged) is permuted wrongly; and mmcv's modules have no conversion at all, so a
spconv-trained checkpoint does not load where spconv is absent ("size mismatch").

The patch gives both backends' ``SparseConvolution`` the loader of
:mod:`mmdet3d_scaling.ops.sparse_layout`: the layout is read off the
weight's shape and converted to the module's own (metadata ``version`` 2 decides only a
tie, when both layouts give one shape). Round trips for mmdet3d's ``SparseEncoder`` and
BEVFusion's are tested in ``tests/patches/fixes/test_sparse_conv_layout.py``.
"""
import importlib
import importlib.util
from typing import Callable, List

from packaging.requirements import Requirement

from ...ops.sparse_layout import load_with_layout
from ..patching import Change, Patch, declare, installed_version

UPSTREAM = ('mmcv==2.1.0', 'mmdet3d==1.4.0')
SPCONV = 'spconv>=2.3,<2.4'  # spconv is optional: its loader is replaced only in this range
OWNERS = ('mmcv.ops.sparse_conv', 'spconv.pytorch.conv')


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing or blocked
        return False


def _loader() -> Callable:
    """A function of its own per class (the patch records keep its ``original``)."""
    def _load_from_state_dict(self, *args) -> None:
        load_with_layout(self, *args)

    return _load_from_state_dict


def _spconv_in_range() -> bool:
    found = installed_version('spconv')
    return found is not None and Requirement(SPCONV).specifier.contains(found)


def _changes() -> List[Change]:
    changes = []
    for name in OWNERS:
        if _installed(name) and (name.startswith('mmcv') or _spconv_in_range()):
            cls = importlib.import_module(name).SparseConvolution
            changes.append(Change(cls, '_load_from_state_dict', _loader()))
    return changes


PATCH = declare(Patch(
    name='sparse_conv_layout', kind='fixes',
    targets=tuple(f'{m}.SparseConvolution._load_from_state_dict' for m in OWNERS),
    upstream=UPSTREAM,
    why='sparse-conv weights load into the other backend (mmcv <-> spconv 2.x layout, '
        'decided by shape), also from checkpoints without module metadata',
    changes=_changes))
