"""patches/speed/instance_data_index.py: InstanceData[mask] gives mmengine's result with one
host read instead of one per field."""
import numpy as np
import pytest
import torch
from mmdet.structures.bbox import HorizontalBoxes
from mmdet3d.structures import LiDARInstance3DBoxes
from mmengine.structures import InstanceData

import mmdet3d_scaling  # noqa: F401  (applies the patch)
from mmdet3d_scaling.patches.speed import instance_data_index as patch
from mmdet3d_scaling.patches import patching
from mmdet3d_scaling.diagnostics.host_reads import HostReadCensus

ORIGINAL = patch.getitem.original


def _instances(n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    data = InstanceData(metainfo=dict(sample_idx=seed))
    data.bboxes_3d = LiDARInstance3DBoxes(torch.rand(n, 7, generator=gen))
    data.bboxes = HorizontalBoxes(torch.rand(n, 4, generator=gen))
    data.scores_3d = torch.rand(n, generator=gen)
    data.labels_3d = torch.randint(0, 3, (n, ), generator=gen)
    data.feats = torch.rand(n, 5, generator=gen)
    data.ids = np.arange(n) * 10
    data.names = [f'obj{i}' for i in range(n)]
    return data


def _same(a, b):
    assert a.metainfo == b.metainfo
    assert sorted(a.keys()) == sorted(b.keys())
    for key in a.keys():
        x, y = a[key], b[key]
        assert type(x) is type(y), key
        if isinstance(x, (LiDARInstance3DBoxes, HorizontalBoxes)):
            x, y = x.tensor, y.tensor
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), key
        elif isinstance(x, np.ndarray):
            assert np.array_equal(x, y), key
        else:
            assert x == y, key


def test_the_patch_is_in_place():
    assert InstanceData.__getitem__ is patch.getitem
    assert patching.apply(['instance_data_index']) == []  # applied once; the original stays
    assert patch.getitem.original is ORIGINAL


@pytest.mark.parametrize('n', [0, 1, 9, 200])
@pytest.mark.parametrize('seed', [0, 1, 2])
def test_mask_gives_mmengines_result(n, seed):
    data = _instances(n, seed)
    masks = [torch.rand(n, generator=torch.Generator().manual_seed(seed)) < 0.4,
             torch.zeros(n, dtype=torch.bool), torch.ones(n, dtype=torch.bool)]
    for mask in masks:
        _same(data[mask], ORIGINAL(data, mask))


def test_box_fields_keep_their_type_and_settings():
    data = InstanceData(bboxes_3d=LiDARInstance3DBoxes(torch.rand(6, 9), box_dim=9))
    picked = data[torch.tensor([True, False, True, False, False, True])]
    assert isinstance(picked.bboxes_3d, LiDARInstance3DBoxes)
    assert picked.bboxes_3d.box_dim == 9 and len(picked) == 3
    assert torch.equal(picked.bboxes_3d.tensor, data.bboxes_3d.tensor[[0, 2, 5]])


def test_other_indices_go_through_mmengine():
    data = _instances(8)
    for item in (torch.tensor([3, 1, 1]), slice(2, 5), 4, 'scores_3d'):
        result, expected = data[item], ORIGINAL(data, item)
        if isinstance(item, str):
            assert torch.equal(result, expected)
        else:
            _same(result, expected)


def test_wrong_mask_length_fails_as_in_mmengine():
    data = _instances(5)
    with pytest.raises(AssertionError, match='does not match'):
        data[torch.ones(4, dtype=torch.bool)]
    with pytest.raises(AssertionError):
        ORIGINAL(data, torch.ones(4, dtype=torch.bool))


def test_one_host_read_per_mask_instead_of_one_per_field():
    data = _instances(50)
    del data.ids, data.names  # tensor and box fields only: the case of PV-RCNN's RoI head
    mask = data.labels_3d == 1
    with HostReadCensus() as patched:
        data[mask]
    with HostReadCensus() as upstream:
        ORIGINAL(data, mask)
    assert patched.total == 1
    assert upstream.total >= 4  # a read per tensor field, plus the boxes' copy to the host
