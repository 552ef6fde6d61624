"""patches/speed/multiview_stack.py: the camera stack with Python-int padding, the same
tensor as mmdet3d's ``multiview_img_stack_batch``.

The reference is mmdet3d's function (the patch's ``original``); the preprocessor test
runs a real ``Det3DDataPreprocessor`` with the patch applied and reverted."""
import pytest
import torch

import mmdet3d_scaling  # noqa: F401
from mmdet3d.models.data_preprocessors import Det3DDataPreprocessor
from mmdet3d.models.data_preprocessors import data_preprocessor as preprocessor_module
from mmdet3d_scaling.patches import patching
from mmdet3d_scaling.patches.speed import multiview_stack as patch
from tests.devices import DEVICES

SHAPES = {
    'equal (BEVFusion)': [(6, 3, 256, 704)] * 4,
    'ragged': [(6, 3, 250, 700), (6, 3, 256, 704), (6, 3, 241, 699)],
    'one sample': [(2, 3, 33, 65)],
    'three dims': [(3, 30, 40), (3, 31, 39)],
}


def _tensors(shapes, device):
    gen = torch.Generator().manual_seed(0)
    return [torch.rand(s, generator=gen).to(device) for s in shapes]


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('divisor', [1, 32])
@pytest.mark.parametrize('pad_value', [0, -1.5])
@pytest.mark.parametrize('case', sorted(SHAPES))
def test_same_tensor_as_mmdet3d(case, divisor, pad_value, device):
    tensors = _tensors(SHAPES[case], device)
    ours = patch.multiview_img_stack_batch(tensors, divisor, pad_value)
    theirs = patch.multiview_img_stack_batch.original(tensors, divisor, pad_value)
    assert ours.dtype == theirs.dtype and ours.device == theirs.device
    assert ours.shape == theirs.shape and torch.equal(ours, theirs)


def test_inputs_upstream_rejects_get_upstreams_error():
    with pytest.raises(AssertionError):
        patch.multiview_img_stack_batch([])
    with pytest.raises(AssertionError):
        patch.multiview_img_stack_batch([torch.zeros(3, 4, 4), torch.zeros(4, 4)])


def test_padding_rounds_up_the_last_two_dimensions_only():
    assert patch.padding([(6, 3, 250, 700), (6, 3, 256, 704)], 32) == [
        [0, 0, 6, 4], [0, 0, 0, 0]]


def test_applied_and_reverted_in_the_preprocessor():
    """A real preprocessor stacks the same images with the patch and without; the binding
    it calls is the patch's only while the patch is applied."""
    prep = Det3DDataPreprocessor(mean=[123.675, 116.28, 103.53],
                                 std=[58.395, 57.12, 57.375], pad_size_divisor=32)
    imgs = [t * 255 for t in _tensors(SHAPES['ragged'], 'cpu')]
    data = dict(inputs=dict(img=imgs), data_samples=None)
    was_applied = 'multiview_stack' in patching.applied()
    patching.revert(['multiview_stack'])
    try:
        assert preprocessor_module.multiview_img_stack_batch is \
            patch.multiview_img_stack_batch.original
        theirs = prep(dict(data), training=True)['inputs']['imgs']
        patching.apply(['multiview_stack'])
        assert preprocessor_module.multiview_img_stack_batch is patch.multiview_img_stack_batch
        ours = prep(dict(data), training=True)['inputs']['imgs']
    finally:
        patching.revert(['multiview_stack'])
        if was_applied:
            patching.apply(['multiview_stack'])
    assert torch.equal(ours, theirs)
