"""mmdet3d 1.4.0: the anchor heads build their anchors again at every call.

``Anchor3DHead.get_anchors`` (SECOND, PointPillars, Part-A2, PV-RCNN's RPN; in
``loss_by_feat`` and again in ``predict_by_feat``) calls the generator's
``grid_anchors`` each time. Each range (one a class in the KITTI configs) copies its
range, sizes and rotations to the GPU and hands ``torch.linspace`` GPU scalars: about
nine host waits and ~35 kernels a range, some 27 waits a call with PV-RCNN's three
classes (measured: docs/patches.md, ``anchor_cache``).

The anchors depend only on the generator's settings, the feature map sizes and the
device. The patch keeps the anchors mmdet3d's own code computed for such a key on the
generator (at most :data:`KEPT` keys) and returns fresh copies of them: the same values,
shapes, strides and dtype as a new computation, no host wait. A generator whose
settings changed gets new anchors (the settings are part of the key); a subclass with
its own anchor code, and anchors made in inference mode, are not kept. Tested in
``tests/patches/speed/test_anchor_cache.py``.
"""
from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from ..patching import declare, method_patch

UPSTREAM = 'mmdet3d==1.4.0'
KEPT = 4  # feature-size / device keys a generator keeps (oldest dropped first)
SETTINGS = ('ranges', 'sizes', 'scales', 'rotations', 'custom_values', 'reshape_out',
            'size_per_range', 'align_corner')


def _own_code(generator) -> bool:
    """The generator makes its anchors with mmdet3d's code."""
    from mmdet3d.models.task_modules.anchor import (AlignedAnchor3DRangeGenerator,
                                                    Anchor3DRangeGenerator)
    cls = type(generator)
    return (cls.single_level_grid_anchors is Anchor3DRangeGenerator.single_level_grid_anchors
            and cls.anchors_single_range in (
                Anchor3DRangeGenerator.anchors_single_range,
                AlignedAnchor3DRangeGenerator.anchors_single_range))


def _plain(value):
    """A setting as plain Python (numpy's repr elides long arrays: not a key)."""
    return value.tolist() if isinstance(value, np.ndarray) else value


def _key(generator, featmap_sizes: Sequence, device) -> Tuple:
    settings = repr(tuple(_plain(getattr(generator, name, None)) for name in SETTINGS))
    sizes = tuple(tuple(int(s) for s in size) for size in featmap_sizes)
    return type(generator), settings, sizes, str(torch.device(device))


def grid_anchors(self, featmap_sizes: List[tuple], device='cuda') -> List[Tensor]:
    """``grid_anchors`` computed once a key, returned as fresh copies."""
    if not _own_code(self):
        return grid_anchors.original(self, featmap_sizes, device)
    cache: Dict[Tuple, List[Tensor]] = self.__dict__.setdefault('_grid_anchor_cache', {})
    key = _key(self, featmap_sizes, device)
    if key in cache:
        return [a.clone() for a in cache[key]]  # callers may change theirs in place
    anchors = grid_anchors.original(self, featmap_sizes, device)
    if not any(a.is_inference() for a in anchors):
        cache[key] = [a.clone() for a in anchors]
        while len(cache) > KEPT:
            del cache[next(iter(cache))]
    return anchors


PATCH = declare(method_patch(
    'anchor_cache', 'speed', 'mmdet3d.models.task_modules.anchor:Anchor3DRangeGenerator',
    'grid_anchors', grid_anchors, UPSTREAM,
    why='anchor heads build their anchors at every call (~9 waits a class): computed '
        'once a feature size, the same anchors copied'))
