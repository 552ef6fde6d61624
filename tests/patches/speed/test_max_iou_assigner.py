"""patches/speed/max_iou_assigner.py: the loop-free MaxIoUAssigner gives mmdet's assignment."""
import pytest
import torch

import mmdet3d_scaling  # noqa: F401  (applies the patch)
from mmdet.models.task_modules.assigners import MaxIoUAssigner
from mmdet3d.models.task_modules.assigners import Max3DIoUAssigner
from mmdet3d_scaling.patches.speed import max_iou_assigner as patch
from mmdet3d_scaling.patches import patching

ORIGINAL = patch.assign_wrt_overlaps.original
# named with its scope: other tests leave another default scope set
IOU = dict(type='mmdet.BboxOverlaps2D')


def _overlaps(num_gts, num_priors, seed, ties=True):
    gen = torch.Generator().manual_seed(seed)
    # IoUs on a coarse grid make exact ties (a gt's best IoU at several priors, several
    # gts best at one prior) common; -1 marks priors ignored by iof
    overlaps = (torch.rand(num_gts, num_priors, generator=gen) * 20).floor() / 20 \
        if ties else torch.rand(num_gts, num_priors, generator=gen)
    overlaps[:, torch.rand(num_priors, generator=gen) < 0.05] = -1
    labels = torch.randint(0, 3, (num_gts, ), generator=gen)
    return overlaps, labels


def _same(a, b):
    assert a.num_gts == b.num_gts
    for name in ('gt_inds', 'max_overlaps', 'labels'):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and torch.equal(x, y), name


def test_the_patch_is_in_place_for_3d_assigners_too():
    assert MaxIoUAssigner.assign_wrt_overlaps is patch.assign_wrt_overlaps
    assert Max3DIoUAssigner.assign_wrt_overlaps is patch.assign_wrt_overlaps
    assert ORIGINAL is not patch.assign_wrt_overlaps
    assert patching.apply(['max_iou_assigner']) == []  # applied once; the original stays
    assert patch.assign_wrt_overlaps.original is ORIGINAL


@pytest.mark.parametrize('settings', [
    dict(pos_iou_thr=0.6, neg_iou_thr=0.45, min_pos_iou=0.45),  # PV-RCNN's car RPN
    dict(pos_iou_thr=0.5, neg_iou_thr=0.35, min_pos_iou=0.35, gt_max_assign_all=False),
    dict(pos_iou_thr=0.55, neg_iou_thr=0.55, min_pos_iou=0.55),  # its RoI assigner
    dict(pos_iou_thr=0.7, neg_iou_thr=(0.1, 0.3), min_pos_iou=0.3),
    dict(pos_iou_thr=0.5, neg_iou_thr=0.5, min_pos_iou=0.0, match_low_quality=False),
    dict(pos_iou_thr=0.5, neg_iou_thr=0.4, min_pos_iou=0.9),  # few gts qualify
])
@pytest.mark.parametrize('shape', [(1, 50), (7, 300), (40, 2000), (60, 5)])
@pytest.mark.parametrize('ties', [True, False])
def test_same_assignment_as_mmdet(settings, shape, ties):
    assigner = MaxIoUAssigner(**settings, iou_calculator=IOU)
    for seed in range(3):
        overlaps, labels = _overlaps(*shape, seed=seed, ties=ties)
        _same(patch.assign_wrt_overlaps(assigner, overlaps, labels),
              ORIGINAL(assigner, overlaps, labels))


def test_later_ground_truths_win_as_in_the_loop():
    # prior 0 is the best of gt 0 and of gt 1: the loop gives it to gt 1 (written last);
    # gt 1 is as good at prior 1, which it also gets when every best prior is matched
    overlaps = torch.tensor([[0.3, 0.1, 0.0], [0.3, 0.3, 0.0]])
    for assign_all in (True, False):
        assigner = MaxIoUAssigner(pos_iou_thr=0.5, neg_iou_thr=0.1, min_pos_iou=0.2,
                                  gt_max_assign_all=assign_all, iou_calculator=IOU)
        result = patch.assign_wrt_overlaps(assigner, overlaps, torch.tensor([4, 7]))
        assert result.gt_inds.tolist() == [2, 2 if assign_all else -1, 0]
        assert result.labels.tolist() == [7, 7 if assign_all else -1, -1]
        _same(result, ORIGINAL(assigner, overlaps, torch.tensor([4, 7])))


@pytest.mark.parametrize('shape', [(0, 10), (3, 0)])
def test_empty_inputs_take_the_original_path(shape):
    assigner = MaxIoUAssigner(pos_iou_thr=0.5, neg_iou_thr=0.4, iou_calculator=IOU)
    overlaps = torch.zeros(shape)
    _same(patch.assign_wrt_overlaps(assigner, overlaps, torch.zeros(shape[0]).long()),
          ORIGINAL(assigner, overlaps, torch.zeros(shape[0]).long()))


@pytest.mark.slow
@pytest.mark.parametrize('value,expected', [
    ('max_iou_assigner', 'mmdet.models.task_modules.assigners.max_iou_assigner'),
    ('', 'mmdet3d_scaling.patches.speed.max_iou_assigner'),
])
def test_the_patch_can_be_skipped(value, expected):
    import os
    import subprocess
    import sys
    code = ('import mmdet3d_scaling\n'
            'from mmdet3d_scaling.patches import patching\n'
            "patching.apply(['speed'])\n"
            'from mmdet.models.task_modules.assigners import MaxIoUAssigner\n'
            'print(MaxIoUAssigner.assign_wrt_overlaps.__module__)')
    env = dict(os.environ, MMDET3D_SCALING_SKIP_PATCHES=value)
    out = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == expected


@pytest.mark.slow
def test_an_unknown_patch_name_is_an_error():
    import os
    import subprocess
    import sys
    env = dict(os.environ, MMDET3D_SCALING_SKIP_PATCHES='max_iou_asigner')
    out = subprocess.run([sys.executable, '-c', 'import mmdet3d_scaling'], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "unknown patch(es) ['max_iou_asigner']" in out.stderr
