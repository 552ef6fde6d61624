"""mmdet3d 1.4.0: KITTI evaluation without a GPU.

``KittiMetric`` computes bird's-eye and 3D overlaps with
``kitti_utils.rotate_iou.rotate_iou_gpu_eval``, a numba-CUDA kernel compiled when its
module is imported, so on a machine without a CUDA driver every KITTI evaluation dies
with ``CudaSupportError: CUDA driver library cannot be found``. The patch puts a
stand-in for that module in ``sys.modules`` (mmdet3d imports it lazily, inside the
overlap functions). On its first call it asks numba for a CUDA device: with one, it
loads and uses upstream's kernel; without, a CPU twin with the same signature and
results, computed with mmcv's compiled ``box_iou_rotated``.
"""
import sys
import types
from typing import List

import numpy as np

from ..patching import Change, Patch, declare

UPSTREAM = 'mmdet3d==1.4.0'
MODULE = 'mmdet3d.evaluation.functional.kitti_utils.rotate_iou'


def rotate_iou_cpu_eval(boxes: np.ndarray, query_boxes: np.ndarray, criterion: int = -1,
                        device_id: int = 0) -> np.ndarray:
    """CPU version of mmdet3d's ``rotate_iou_gpu_eval``.

    Args:
        boxes: (N, 5) bird's-eye boxes (x, y, dx, dy, angle) in the camera frame,
            angle clockwise-positive as upstream defines it.
        query_boxes: (K, 5) boxes in the same format.
        criterion: -1 IoU, 0 intersection / area(query box), 1 intersection /
            area(box), anything else the intersection area (as upstream).
        device_id: ignored (upstream's GPU index).

    Returns:
        (N, K) array in the dtype of ``boxes`` after upstream's float32 cast.
    """
    import torch
    from mmcv.ops import box_iou_rotated
    boxes = np.asarray(boxes, np.float32)
    query_boxes = np.asarray(query_boxes, np.float32)
    out = np.zeros((len(boxes), len(query_boxes)), np.float32)
    if len(boxes) == 0 or len(query_boxes) == 0:
        return out
    b, q = torch.from_numpy(boxes), torch.from_numpy(query_boxes)
    # upstream's corners: x' = cos*x + sin*y, y' = -sin*x + cos*y (mmcv's CCW convention)
    iof = box_iou_rotated(b, q, mode='iof', aligned=False, clockwise=False).numpy()
    area_b = (boxes[:, 2] * boxes[:, 3])[:, None]
    area_q = (query_boxes[:, 2] * query_boxes[:, 3])[None, :]
    inter = iof * area_b
    if criterion == -1:
        out = inter / np.maximum(area_b + area_q - inter, 1e-12)
    elif criterion == 0:
        out = inter / np.maximum(area_q, 1e-12)
    elif criterion == 1:
        out = inter / np.maximum(area_b, 1e-12)
    else:
        out = inter
    return out.astype(np.float32)


def _cuda_available() -> bool:
    try:
        from numba import cuda
        return bool(cuda.is_available())
    except Exception:  # numba without its CUDA part counts as no CUDA
        return False


def _load_upstream() -> types.ModuleType:
    """Upstream's rotate_iou module, loaded from its file (not via sys.modules)."""
    import importlib.util
    import os.path as osp

    import mmdet3d.evaluation.functional.kitti_utils as kitti_utils
    path = osp.join(osp.dirname(kitti_utils.__file__), 'rotate_iou.py')
    spec = importlib.util.spec_from_file_location(MODULE + '_upstream', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_IMPL = {}


def rotate_iou_eval(boxes, query_boxes, criterion=-1, device_id=0):
    """Upstream's GPU kernel when numba has a CUDA device, else the CPU twin."""
    if 'fn' not in _IMPL:
        _IMPL['fn'] = (_load_upstream().rotate_iou_gpu_eval if _cuda_available()
                       else rotate_iou_cpu_eval)
    return _IMPL['fn'](boxes, query_boxes, criterion, device_id)


def _changes() -> List[Change]:
    module = types.ModuleType(MODULE, __doc__)
    module.rotate_iou_gpu_eval = rotate_iou_eval
    return [Change(sys.modules, MODULE, module)]


PATCH = declare(Patch(
    name='kitti_eval_cpu', kind='cpu', targets=(f'sys.modules[{MODULE!r}]',),
    upstream=UPSTREAM, changes=_changes,
    why='the KITTI metric needs a CUDA driver (numba.cuda rotated IoU): a CPU twin '
        'with mmcv\'s box_iou_rotated when there is none'))
