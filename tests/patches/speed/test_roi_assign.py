"""patches/speed/roi_assign.py: PV-RCNN's RoI assignment and sampling with one host read a
batch for the class split, every SamplingResult field as upstream.

The head is PV-RCNN's own RoI head with its per-class assigners and IoU piecewise
sampler, built from the plugin's PV-RCNN config; the sampler draws at random, so each
side runs from the same seed."""
import copy

import pytest
import torch
from mmengine.structures import InstanceData

import mmdet3d_scaling  # noqa: F401  (applies the patches)
from mmdet3d_scaling.patches.speed import roi_assign as patch
from mmdet3d_scaling.patches import patching
from mmdet3d_scaling.diagnostics.host_reads import HostReadCensus
from tests.devices import needs_cuda
from tests.pv_rcnn_heads import assert_same_sampling_result, build_pv_rcnn_head

ORIGINAL = patch.assign_and_sample.original


@pytest.fixture(scope='module')
def head():
    return build_pv_rcnn_head('roi_head', 'rcnn')


def _boxes(n, gen):
    centres = torch.rand(n, 3, generator=gen) * torch.tensor([30., 30., 1.])
    sizes = 1 + 3 * torch.rand(n, 3, generator=gen)
    yaw = (torch.rand(n, 1, generator=gen) - 0.5) * 6.2
    return torch.cat([centres, sizes, yaw], 1)


def _sample(num_gts, num_random, seed, gt_labels=None):
    """Ground truths and proposals: jittered copies of the ground truths (positives at
    several IoUs) and random boxes (negatives), labels from 0..2 (or given)."""
    from mmdet3d.structures import LiDARInstance3DBoxes
    gen = torch.Generator().manual_seed(seed)
    gt = _boxes(num_gts, gen)
    labels = (torch.randint(0, 3, (num_gts, ), generator=gen) if gt_labels is None
              else torch.tensor(gt_labels, dtype=torch.long))
    near = gt.repeat(3, 1) + 0.3 * torch.randn(3 * num_gts, 7, generator=gen)
    proposals = torch.cat([near, _boxes(num_random, gen)])
    n = len(proposals)
    pred_labels = torch.cat([labels.repeat(3), torch.randint(0, 3, (num_random, ),
                                                              generator=gen)])
    pred = InstanceData(bboxes_3d=LiDARInstance3DBoxes(proposals), labels_3d=pred_labels,
                        scores_3d=torch.rand(n, generator=gen),
                        cls_preds=torch.randn(n, 3, generator=gen))
    gts = InstanceData(bboxes_3d=LiDARInstance3DBoxes(gt), labels_3d=labels)
    return pred, gts


def _batch(seed, device='cpu'):
    batch = [_sample(6, 40, seed), _sample(0, 12, seed + 1), _sample(3, 0, seed + 2),
             _sample(5, 30, seed + 3, gt_labels=[2, 2, 2, 2, 2])]
    return [(p.to(device), g.to(device)) for p, g in batch]


def _run(fn, head, batch, seed=123):
    proposals = [copy.deepcopy(p) for p, _ in batch]
    gts = [copy.deepcopy(g) for _, g in batch]
    torch.manual_seed(seed)
    return fn(head, proposals, gts), gts


def test_the_patch_is_in_place():
    from mmdet3d.models.roi_heads import PVRCNNRoiHead
    assert PVRCNNRoiHead._assign_and_sample is patch.assign_and_sample
    assert patching.apply(['roi_assign']) == []  # applied once; the original stays
    assert patch.assign_and_sample.original is ORIGINAL


def _variant(head, name):
    """PV-RCNN's head, or with other assigner rules: low-quality matching off, the
    argmax-only low-quality match, or a nearest-BEV IoU (the class-split path)."""
    if name in ('pv_rcnn', 'split'):
        return head
    head = copy.deepcopy(head)
    for assigner in head.bbox_assigner:
        if name == 'no_low_quality':
            assigner.match_low_quality = False
        elif name == 'argmax_only':
            assigner.gt_max_assign_all, assigner.min_pos_iou = False, 0.1
        elif name == 'nearest_bev':
            from mmdet3d.structures import BboxOverlapsNearest3D
            assigner.iou_calculator = BboxOverlapsNearest3D(coordinate='lidar')
    return head


@pytest.fixture
def batched_on_cpu(monkeypatch):
    """The GPU's batched assignment on the CPU too (the CPU's own path is the class
    split: the 'split' variant)."""
    monkeypatch.setattr(patch, 'BATCHED_ON_CPU', True)


@pytest.mark.parametrize('variant,device', [
    ('pv_rcnn', 'cpu'), ('no_low_quality', 'cpu'), ('argmax_only', 'cpu'),
    ('nearest_bev', 'cpu'), ('split', 'cpu'),
    pytest.param('pv_rcnn', 'cuda', marks=needs_cuda)])
@pytest.mark.parametrize('seed', [0, 1, 2])
def test_same_sampling_results_as_mmdet3d(head, seed, variant, device, monkeypatch):
    monkeypatch.setattr(patch, 'BATCHED_ON_CPU', variant != 'split')
    head = _variant(head, variant)
    batch = _batch(seed, device)
    (ours, our_gts), (theirs, their_gts) = (_run(patch.assign_and_sample, head, batch),
                                            _run(ORIGINAL, head, batch))
    assert len(ours) == len(theirs) == len(batch)
    positives = 0
    for a, b in zip(ours, theirs):
        assert_same_sampling_result(
            a, b, {'pos_inds', 'neg_inds', 'pos_assigned_gt_inds', 'pos_gt_bboxes'})
        assert a.num_gts == b.num_gts
        positives += len(b.pos_inds)
    assert positives > 0  # the cases do assign positives
    for a, b in zip(our_gts, their_gts):  # the side effect on the ground truths too
        assert type(a.bboxes_3d) is type(b.bboxes_3d) is torch.Tensor
        assert torch.equal(a.bboxes_3d, b.bboxes_3d)


@pytest.mark.parametrize('variant,reads', [('pv_rcnn', 1), ('nearest_bev', 2),
                                           ('split', 2)])
def test_host_reads_a_batch(head, variant, reads, monkeypatch):
    """One (batched assignment, the sampler's and ground-truth counts together) or two
    (the class split first) against upstream's per sample and class."""
    monkeypatch.setattr(patch, 'BATCHED_ON_CPU', variant != 'split')
    head = _variant(head, variant)
    batch = _batch(0)
    counts = []
    for fn in (patch.assign_and_sample, ORIGINAL):
        with HostReadCensus() as census:
            _run(fn, head, batch)
        counts.append(census)
    ours, theirs = counts
    here = 'patches/speed/roi_assign.py'
    assert sum(s['count'] for s in ours.sites(50) if here in s['site']) == ours.total == reads
    # upstream: per sample and class, two masked InstanceData (one read each with the
    # instance_data_index patch) and one nonzero; the sampler (patch) one read a sample
    assert theirs.total == 3 * 3 * len(batch) + len(batch)


def test_large_batches_take_their_ious_sample_by_sample(head, batched_on_cpu,
                                                       monkeypatch):
    """Above MAX_PAIRS the whole-batch IoU is replaced by one IoU a sample: the same
    sampling results."""
    from mmdet3d_scaling.patches.speed import _batched_assign
    monkeypatch.setattr(_batched_assign, 'MAX_PAIRS', 100)
    batch = _batch(1)
    (ours, _), (theirs, _) = (_run(patch.assign_and_sample, head, batch),
                              _run(ORIGINAL, head, batch))
    for a, b in zip(ours, theirs):
        assert_same_sampling_result(a, b, {'pos_inds', 'neg_inds'})
