"""patches/speed/iou_piecewise_sampler.py: PV-RCNN's RoI sampler with one host read a call,
the same RoIs drawn from the same seed, every SamplingResult field as upstream.

The sampler is PV-RCNN's own (128 RoIs, half positive, negatives in two IoU pieces
0.8 / 0.2 split at IoU 0.1, IoUs returned), built from the plugin's PV-RCNN config. The
assignments are written by hand to reach each branch of the negative sampling: full
pieces, a short first piece, a short last piece topped up at random, an empty last
piece, no negatives, no positives."""
import copy

import pytest
import torch
from mmdet.models.task_modules import AssignResult

import mmdet3d_scaling  # noqa: F401  (applies the patches)
from mmdet3d_scaling.patches.speed import iou_piecewise_sampler as patch
from mmdet3d_scaling.patches import patching
from mmdet3d_scaling.diagnostics.host_reads import HostReadCensus
from tests.devices import DEVICES
from tests.pv_rcnn_heads import assert_same_sampling_result, build_pv_rcnn_head

ORIGINAL = patch.sample.original
NUM_GTS = 5

# name: (positives, negatives in IoU [0.1, 0.55), negatives in [0, 0.1), ignored)
CASES = {
    'full_pieces': (100, 150, 80, 10),
    'few_positives': (3, 150, 80, 0),
    'short_first_piece': (20, 5, 200, 0),
    'short_last_piece': (20, 200, 4, 0),
    'empty_last_piece': (20, 30, 0, 5),
    'no_negatives': (40, 0, 0, 10),
    'no_positives': (0, 90, 60, 0),
}


@pytest.fixture(scope='module')
def sampler():
    return build_pv_rcnn_head('roi_head', 'rcnn').bbox_sampler


def _assignment(case, seed, device):
    positives, high, low, ignored = CASES[case]
    gen = torch.Generator().manual_seed(seed)
    gt_inds = torch.cat([torch.randint(1, NUM_GTS + 1, (positives, ), generator=gen),
                         torch.zeros(high + low, dtype=torch.long),
                         torch.full((ignored, ), -1)])
    overlaps = torch.cat([0.55 + 0.45 * torch.rand(positives, generator=gen),
                          0.1 + 0.45 * torch.rand(high, generator=gen),
                          0.1 * torch.rand(low, generator=gen),
                          0.3 * torch.rand(ignored, generator=gen)])
    order = torch.randperm(len(gt_inds), generator=gen)  # kinds interleaved
    gt_inds, overlaps = gt_inds[order], overlaps[order]
    labels = torch.where(gt_inds > 0, (gt_inds - 1) % 3, -1)
    result = AssignResult(NUM_GTS, gt_inds.to(device), overlaps.to(device),
                          labels.to(device))
    boxes = torch.randn(len(gt_inds), 7, generator=gen).to(device)
    return result, boxes, torch.randn(NUM_GTS, 7, generator=gen).to(device)


def _draw(fn, sampler, case, seed, device):
    assign, boxes, gt_boxes = _assignment(case, seed, device)
    torch.manual_seed(1000 + seed)
    return fn(sampler, copy.deepcopy(assign), boxes, gt_boxes)


def test_the_patch_is_in_place():
    from mmdet3d.models.task_modules.samplers import IoUNegPiecewiseSampler
    assert IoUNegPiecewiseSampler.sample is patch.sample
    assert patching.apply(['iou_piecewise_sampler']) == []  # applied once; the original stays
    assert patch.sample.original is ORIGINAL


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('case', sorted(CASES))
@pytest.mark.parametrize('seed', [0, 1])
def test_same_sampling_result_as_mmdet3d(sampler, case, seed, device):
    ours, theirs = (_draw(fn, sampler, case, seed, device) for fn in (patch.sample,
                                                                       ORIGINAL))
    assert_same_sampling_result(ours, theirs,
                                {'pos_inds', 'neg_inds', 'iou', 'pos_assigned_gt_inds'})
    assert len(theirs.pos_inds) + len(theirs.neg_inds) == sampler.num or \
        CASES[case][1] + CASES[case][2] == 0


def test_the_draws_are_random(sampler):
    """Another seed, other RoIs: the comparison above is not of fixed choices."""
    a = _draw(patch.sample, sampler, 'full_pieces', 0, 'cpu')
    assign, boxes, gt_boxes = _assignment('full_pieces', 0, 'cpu')
    torch.manual_seed(7)
    b = patch.sample(sampler, assign, boxes, gt_boxes)
    assert not torch.equal(a.neg_inds, b.neg_inds)


def test_a_negative_upper_bound(sampler):
    sampler = copy.deepcopy(sampler)
    sampler.neg_pos_ub = 1.5
    for case in ('few_positives', 'no_positives'):
        ours, theirs = (_draw(fn, sampler, case, 0, 'cpu') for fn in (patch.sample,
                                                                        ORIGINAL))
        assert torch.equal(ours.neg_inds, theirs.neg_inds)
        assert len(ours.neg_inds) == int(1.5 * max(1, CASES[case][0]))


def test_gt_as_proposals_goes_to_the_original(sampler):
    sampler = copy.deepcopy(sampler)
    sampler.add_gt_as_proposals = True
    results = []
    for fn in (patch.sample, ORIGINAL):
        assign, boxes, gt_boxes = _assignment('full_pieces', 0, 'cpu')
        torch.manual_seed(0)
        with HostReadCensus() as census:
            results.append(fn(sampler, assign, boxes, gt_boxes,
                              torch.zeros(NUM_GTS, dtype=torch.long)))
        assert census.total > 1  # the original's reads
    ours, theirs = results
    assert torch.equal(ours.pos_inds, theirs.pos_inds)
    assert torch.equal(ours.neg_inds, theirs.neg_inds)


def test_one_read_a_call(sampler):
    counts = []
    for fn in (patch.sample, ORIGINAL):
        with HostReadCensus() as census:
            _draw(fn, sampler, 'full_pieces', 0, 'cpu')
        counts.append(census.total)
    assert counts[0] == 1 and counts[1] >= 5
