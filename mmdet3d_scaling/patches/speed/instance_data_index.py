"""mmengine 0.10.x: indexing ``InstanceData`` by a mask waits on the GPU once per field,
and selects boxes one at a time.

``InstanceData.__getitem__`` with a boolean mask indexes every tensor field with the
mask (each a ``nonzero``, so one host wait per field) and selects box fields
(mmdet3d's ``BaseInstance3DBoxes``, mmdet's ``BaseBoxes``) by copying the mask to the
host and slicing out one box per selected index in a Python loop before concatenating
them. PV-RCNN's RoI head does this for every class and sample (``proposals[labels ==
i]``, ``gt_instances[gt_labels == i]``): counted on its training step, 15 host waits a
sample and a few hundred box objects built in Python.

The patch turns a 1-D boolean mask into indices once (one host wait) and gathers tensor
and box fields with them (no further wait, no loop). Other field types (numpy arrays,
lists, strings, any other object with ``cat``) and other kinds of index go through
mmengine's own code, so results are identical (tested in
``tests/patches/speed/test_instance_data_index.py``).
"""
from typing import Any

import torch

from ..patching import declare, method_patch

UPSTREAM = 'mmengine>=0.10,<0.11'


def _gathers_by_tensor(value: Any) -> bool:
    """Fields whose ``value[long_tensor]`` equals mmengine's slice-and-cat result."""
    if isinstance(value, torch.Tensor):
        return True
    from mmdet.structures.bbox import BaseBoxes
    from mmdet3d.structures import BaseInstance3DBoxes
    return isinstance(value, (BaseInstance3DBoxes, BaseBoxes))


def getitem(self, item: Any):
    """``InstanceData.__getitem__`` with one host wait per mask (see module doc)."""
    original = getitem.original
    if not (isinstance(item, torch.Tensor) and item.dim() == 1
            and item.dtype == torch.bool):
        return original(self, item)
    assert len(item) == len(self), (  # mmengine's check, same exception type
        f'The shape of the input(BoolTensor) {len(item)} does not match the shape of '
        f'the indexed tensor in results_field {len(self)} at first dimension.')
    return take_rows(self, item.nonzero().view(-1))  # the one host wait


def take_rows(data: Any, index: torch.Tensor):
    """``data[index]`` for an ``InstanceData`` and a 1-D tensor of non-negative row
    indices, without a host read for the tensor and box fields (gathered on the device,
    in index order); other fields go through mmengine's own indexing."""
    original = getitem.original
    new_data = data.__class__(metainfo=data.metainfo)
    for key, value in data.items():
        if _gathers_by_tensor(value):
            new_data[key] = value[index.to(value.device)]
        else:  # mmengine's own handling of this field, by the same indices
            single = data.__class__(metainfo=data.metainfo)
            single[key] = value
            new_data[key] = original(single, index)[key]
    return new_data


PATCH = declare(method_patch(
    'instance_data_index', 'speed', 'mmengine.structures:InstanceData',
    '__getitem__', getitem, UPSTREAM,
    why='InstanceData[mask] waits on the GPU once per field: one wait'))
