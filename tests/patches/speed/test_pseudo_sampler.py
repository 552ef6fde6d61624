"""patches/speed/pseudo_sampler.py: mmdet3d's PseudoSampler result with one host read."""
import pytest
import torch
from mmdet.models.task_modules import AssignResult
from mmdet3d.models.task_modules.samplers import PseudoSampler
from mmengine.structures import InstanceData

import mmdet3d_scaling  # noqa: F401  (applies the patch)
from mmdet3d_scaling.patches.speed import pseudo_sampler as patch
from mmdet3d_scaling.patches import patching
from mmdet3d_scaling.diagnostics.host_reads import HostReadCensus

ORIGINAL = patch.sample.original
FIELDS = ('pos_inds', 'neg_inds', 'pos_priors', 'neg_priors', 'pos_is_gt',
          'pos_assigned_gt_inds', 'pos_gt_labels', 'pos_gt_bboxes')


def _case(num_priors, num_gts, seed, kinds=(-1, 0, 1)):
    """Priors, gt boxes (a tensor, as the anchor heads pass them) and an assignment
    whose gt_inds mix ignored (-1), negative (0) and positive (1..num_gts) priors."""
    gen = torch.Generator().manual_seed(seed)
    kind = torch.tensor(kinds)[torch.randint(0, len(kinds), (num_priors, ), generator=gen)]
    gt = torch.randint(1, max(num_gts, 1) + 1, (num_priors, ), generator=gen)
    gt_inds = torch.where(kind > 0, gt, kind) if num_gts else kind.clamp(max=0)
    labels = torch.where(gt_inds > 0, torch.randint(0, 3, (num_priors, ), generator=gen), -1)
    assign = AssignResult(num_gts, gt_inds, torch.rand(num_priors, generator=gen), labels)
    pred = InstanceData(priors=torch.rand(num_priors, 7, generator=gen))
    gts = InstanceData(bboxes_3d=torch.rand(num_gts, 7, generator=gen),
                       labels_3d=torch.randint(0, 3, (num_gts, ), generator=gen))
    return assign, pred, gts


def test_the_patch_is_in_place():
    assert PseudoSampler.sample is patch.sample
    assert patching.apply(['pseudo_sampler']) == []  # applied once; the original stays
    assert patch.sample.original is ORIGINAL


@pytest.mark.parametrize('num_priors,num_gts', [(0, 0), (1, 1), (50, 0), (300, 7),
                                                (5000, 35)])
@pytest.mark.parametrize('kinds', [(-1, 0, 1), (0, ), (1, ), (-1, ), (0, 1)])
@pytest.mark.parametrize('seed', [0, 1])
def test_same_sampling_result_as_mmdet3d(num_priors, num_gts, kinds, seed):
    assign, pred, gts = _case(num_priors, num_gts, seed, kinds)
    sampler = PseudoSampler()
    ours, theirs = sampler.sample(assign, pred, gts), ORIGINAL(sampler, assign, pred, gts)
    for name in FIELDS:
        a, b = getattr(ours, name), getattr(theirs, name)
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), name
    assert (ours.num_pos, ours.num_neg, ours.avg_factor) == \
        (theirs.num_pos, theirs.num_neg, theirs.avg_factor)


def test_one_host_read_instead_of_four():
    assign, pred, gts = _case(400, 10, seed=3)
    sampler = PseudoSampler()
    with HostReadCensus() as patched:
        sampler.sample(assign, pred, gts)
    with HostReadCensus() as upstream:
        ORIGINAL(sampler, assign, pred, gts)
    assert patched.total == 1
    assert upstream.total == 4  # two nonzero, two unique
