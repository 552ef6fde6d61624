"""mmdet3d 1.4.0: ``multiview_img_stack_batch`` computes its padding with CPU tensors.

``Det3DDataPreprocessor.collate_data`` stacks each sample's camera images (BEVFusion:
six a sample) with ``multiview_img_stack_batch``, which puts the image shapes into a
float CPU tensor and takes their maximum, ceiling, difference and sum with torch ops:
in BEVFusion's train step on an H200 the ``data_preprocessor`` stage spent 9-10 ms of
host time in that ``aten::max`` a micro-batch with the GPU idle
(docs/data/same_call_2026-12-03/bevfusion_step_bf16_spconv_profile.log).

The patch does the same arithmetic on the Python ints of the shapes: the maximum of
each dimension, rounded up to ``pad_size_divisor``, the channel dimensions never padded,
right / bottom padding with ``pad_value``, and ``torch.stack`` alone where nothing needs
padding: the same tensor as upstream (``tests/patches/speed/test_multiview_stack.py``).
Upstream's float arithmetic is exact for image sizes (integers below 2**24), so the
padding is the same too. Inputs upstream rejects go to the original (its assertions).
"""
import math
from typing import List, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from ..patching import Change, Patch, declare, resolve_owner

UPSTREAM = 'mmdet3d==1.4.0'
#: the module that defines it, then the one that binds it by name (the preprocessor)
MODULES = ('mmdet3d.models.data_preprocessors.utils',
           'mmdet3d.models.data_preprocessors.data_preprocessor')


def padding(shapes: Sequence[Sequence[int]], divisor: int) -> List[List[int]]:
    """Per tensor, what to add to each dimension: the last two grow to the batch maximum
    rounded up to ``divisor``; the leading ones (views, channels) never grow."""
    dims = len(shapes[0])
    target = [math.ceil(max(s[d] for s in shapes) / divisor) * divisor for d in range(dims)]
    return [[0] * (dims - 2) + [target[d] - s[d] for d in range(dims - 2, dims)]
            for s in shapes]


def multiview_img_stack_batch(tensor_list: List[Tensor], pad_size_divisor: int = 1,
                              pad_value: Union[int, float] = 0) -> Tensor:
    """mmdet3d's ``multiview_img_stack_batch`` with its padding computed on Python ints."""
    if (not isinstance(tensor_list, list) or not tensor_list
            or len({t.ndim for t in tensor_list}) != 1 or tensor_list[0].ndim < 2
            or not isinstance(pad_size_divisor, int) or pad_size_divisor <= 0):
        return multiview_img_stack_batch.original(tensor_list, pad_size_divisor, pad_value)
    pads = padding([tuple(t.shape) for t in tensor_list], pad_size_divisor)
    if not any(any(p) for p in pads):
        return torch.stack(tensor_list)
    out = []
    for tensor, pad in zip(tensor_list, pads):
        # F.pad lists the last dimension first, (before, after) each: after only
        flat = [v for size in reversed(pad) for v in (0, size)]
        out.append(F.pad(tensor, tuple(flat), value=pad_value))
    return torch.stack(out)


def _changes() -> List[Change]:
    return [Change(resolve_owner(m), 'multiview_img_stack_batch', multiview_img_stack_batch)
            for m in MODULES]


multiview_img_stack_batch.original = resolve_owner(MODULES[0]).multiview_img_stack_batch

PATCH = declare(Patch(
    name='multiview_stack', kind='speed',
    targets=tuple(f'{m}.multiview_img_stack_batch' for m in MODULES),
    upstream=UPSTREAM, changes=_changes,
    why="the camera images' padding is computed with CPU tensor ops (9-10 ms of host "
        "time in BEVFusion's data_preprocessor): the same sizes on Python ints"))
