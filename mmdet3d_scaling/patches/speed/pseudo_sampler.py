"""mmdet3d 1.4.0: ``PseudoSampler.sample`` waits on the GPU four times a call.

mmdet3d's ``PseudoSampler`` (the anchor heads of SECOND, PointPillars, Part-A2 and
PV-RCNN call it per sample and class) finds its positive and negative priors with
``nonzero(...).unique()`` twice: each ``nonzero`` and each ``unique`` has a result size
known only on the GPU, so the CPU waits four times. ``unique`` changes nothing there
(``nonzero`` already gives distinct indices in ascending order).

The patch reads both counts in one host read and takes the indices from one stable
sort of the priors by kind (positive, negative, ignored): the same ascending int64
indices, one wait instead of four. Equality with the original is tested in
``tests/patches/speed/test_pseudo_sampler.py``.
"""
import torch

from ..patching import declare, method_patch

UPSTREAM = 'mmdet3d==1.4.0'


def positive_and_negative(gt_inds: torch.Tensor):
    """Ascending indices of ``gt_inds > 0`` and of ``gt_inds == 0`` with one host read."""
    positive, negative = gt_inds > 0, gt_inds == 0
    num_pos, num_neg = torch.stack([positive.sum(), negative.sum()]).tolist()
    kind = torch.where(positive, 0, torch.where(negative, 1, 2))
    order = torch.argsort(kind, stable=True)  # ascending index within each kind
    return order[:num_pos], order[num_pos:num_pos + num_neg]


def sample(self, assign_result, pred_instances, gt_instances, *args, **kwargs):
    """``PseudoSampler.sample`` with one host read (see module doc)."""
    from mmdet3d.models.task_modules.samplers import SamplingResult
    priors = pred_instances.priors
    pos_inds, neg_inds = positive_and_negative(assign_result.gt_inds)
    return SamplingResult(
        pos_inds=pos_inds, neg_inds=neg_inds, priors=priors,
        gt_bboxes=gt_instances.bboxes_3d, assign_result=assign_result,
        gt_flags=priors.new_zeros(priors.shape[0], dtype=torch.uint8),
        avg_factor_with_neg=False)


PATCH = declare(method_patch(
    'pseudo_sampler', 'speed', 'mmdet3d.models.task_modules.samplers:PseudoSampler',
    'sample', sample, UPSTREAM,
    why='PseudoSampler waits on the GPU four times a call: same indices, one wait'))
