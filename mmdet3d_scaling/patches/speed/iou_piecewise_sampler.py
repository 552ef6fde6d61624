"""mmdet3d 1.4.0: ``IoUNegPiecewiseSampler.sample`` waits on the GPU ~5 times a call.

PV-RCNN's and Part-A2's RoI heads sample each sample's RoIs with the IoU piecewise
sampler: ``nonzero`` for the positives, ``unique`` on them, ``nonzero`` for the
negatives and once more per IoU piece -- a host wait each, because each result's size is
known only on the GPU. Counted on PV-RCNN on an H200: 40 of a micro-batch's 160 host
reads.

Every size the sampler needs follows from a few counts (positives, negatives, the
negatives in each IoU piece). The patch reads them in one go (``piece_counts``, one host
read a call; ``roi_assign`` reads a whole batch's at once) and then draws exactly as the
original draws: the same ``randperm`` / ``randint`` calls in the same order with the
same sizes (their indices sent to the GPU pinned and non-blocking: mmdet's
``random_choice`` copies them from pageable memory, a wait each), so seeded runs pick
the same RoIs -- including upstream's last-piece
top-up, which appends positions within the piece rather than RoI indices. Indices come
from a stable sort of the mask (ascending, like ``nonzero``); ``unique`` on the
positives changes nothing there (they are distinct) beyond sorting them. With
``add_gt_as_proposals`` the original runs. Equality of every ``SamplingResult`` field is
tested in ``tests/patches/speed/test_iou_piecewise_sampler.py``.
"""
import math
from typing import List, Sequence

import torch
from torch import Tensor

from ...utils.device_copy import to_device
from ..patching import declare, method_patch

UPSTREAM = 'mmdet3d==1.4.0'


def _pieces(sampler) -> List[tuple]:
    """(min, max) IoU of each negative piece; the last piece reaches down to 0."""
    thrs, last = sampler.neg_iou_thr, sampler.neg_piece_num - 1
    return [(0 if p == last else thrs[p + 1], thrs[p]) for p in range(last + 1)]


def piece_counts(sampler, assign_result) -> Tensor:
    """Positives, negatives and the negatives of each IoU piece: (2 + pieces, ) on the
    device, the only sizes ``sample_with_counts`` needs."""
    gt_inds, overlaps = assign_result.gt_inds, assign_result.max_overlaps
    negative = gt_inds == 0
    masks = [gt_inds > 0, negative] + [
        negative & (overlaps >= low) & (overlaps < high) for low, high in _pieces(sampler)]
    return torch.stack([m.sum() for m in masks])


def _true_indices(mask: Tensor, count: int) -> Tensor:
    """``nonzero(mask)`` (ascending) when the host already knows how many are true."""
    return torch.argsort((~mask).to(torch.uint8), stable=True)[:count]


def random_choice(gallery: Tensor, num: int) -> Tensor:
    """mmdet's ``RandomSampler.random_choice`` of a tensor gallery: the same CPU
    ``randperm`` draw, its indices sent to the gallery's device without a wait (mmdet
    copies them from pageable memory: a wait for the GPU's queue each call)."""
    if len(gallery) < num:
        raise ValueError(f'random_choice: {num} wanted from a gallery of {len(gallery)}')
    perm = torch.randperm(gallery.numel())[:num]
    return gallery[to_device(perm, gallery.device)]


def _sample_neg(sampler, assign_result, num_expected: int, counts: Sequence[int]):
    num_neg, piece_sizes = counts[1], counts[2:]
    neg_inds = _true_indices(assign_result.gt_inds == 0, num_neg)
    if num_neg <= 0:
        return neg_inds
    chosen, num_chosen, extend_num = neg_inds.new_zeros([0]), 0, 0
    overlaps = assign_result.max_overlaps[neg_inds]
    last = sampler.neg_piece_num - 1
    for piece, ((low, high), size) in enumerate(zip(_pieces(sampler), piece_sizes)):
        if piece == last:
            expected = num_expected - num_chosen
        else:  # a short earlier piece passes its shortfall on to this one
            expected = min(num_expected, math.ceil(
                num_expected * sampler.neg_piece_fractions[piece]) + extend_num)
        piece_inds = _true_indices((overlaps >= low) & (overlaps < high), size)
        if size < expected:
            chosen, num_chosen = torch.cat([chosen, neg_inds[piece_inds]]), num_chosen + size
            extend_num += expected - size
            if piece == last:  # top up at random, drawn as upstream draws (CPU RNG)
                extra = num_expected - num_chosen
                source = piece_inds if size > 0 else chosen
                rand_idx = torch.randint(low=0, high=source.numel(), size=(extra, )).long()
                rand_idx = to_device(rand_idx, source.device)
                chosen, num_chosen = torch.cat([chosen, source[rand_idx]]), num_expected
        else:
            picked = random_choice(piece_inds, expected)
            chosen, num_chosen = torch.cat([chosen, neg_inds[picked]]), num_chosen + expected
            extend_num = 0
    assert num_chosen == num_expected
    return chosen


def sample_with_counts(sampler, assign_result, bboxes: Tensor, gt_bboxes: Tensor,
                       counts: Sequence[int]):
    """``IoUNegPiecewiseSampler.sample`` (no gt proposals) given ``piece_counts`` on the
    host: no host read, the same draws."""
    from mmdet3d.models.task_modules.samplers import SamplingResult
    if len(bboxes.shape) < 2:
        bboxes = bboxes[None, :]
    gt_flags = bboxes.new_zeros((bboxes.shape[0], ), dtype=torch.bool)
    num_pos = counts[0]
    pos_inds = _true_indices(assign_result.gt_inds > 0, num_pos)
    num_expected_pos = int(sampler.num * sampler.pos_fraction)
    if num_pos > num_expected_pos:
        pos_inds = random_choice(pos_inds, num_expected_pos)
    pos_inds = pos_inds.sort().values  # what upstream's unique() does to distinct indices
    num_expected_neg = sampler.num - pos_inds.numel()
    if sampler.neg_pos_ub >= 0:
        num_expected_neg = min(num_expected_neg,
                               int(sampler.neg_pos_ub * max(1, pos_inds.numel())))
    neg_inds = _sample_neg(sampler, assign_result, num_expected_neg, counts)
    result = SamplingResult(pos_inds, neg_inds, bboxes, gt_bboxes, assign_result,
                            gt_flags)
    if sampler.return_iou:
        result.iou = assign_result.max_overlaps[torch.cat([pos_inds, neg_inds])]
        result.iou.detach_()
    return result


def batchable(sampler) -> bool:
    """Whether ``piece_counts`` + ``sample_with_counts`` stand in for ``sample``."""
    from mmdet3d.models.task_modules.samplers import IoUNegPiecewiseSampler
    return (type(sampler) is IoUNegPiecewiseSampler and not sampler.add_gt_as_proposals
            and sampler.pos_sampler is sampler and sampler.neg_sampler is sampler)


def sample(self, assign_result, bboxes, gt_bboxes, gt_labels=None, **kwargs):
    """``IoUNegPiecewiseSampler.sample`` with one host read (see the module doc)."""
    if not batchable(self) or kwargs:
        return sample.original(self, assign_result, bboxes, gt_bboxes, gt_labels,
                               **kwargs)
    counts = piece_counts(self, assign_result).tolist()  # the one wait
    return sample_with_counts(self, assign_result, bboxes, gt_bboxes, counts)


PATCH = declare(method_patch(
    'iou_piecewise_sampler', 'speed', 'mmdet3d.models.task_modules.samplers:IoUNegPiecewiseSampler',
    'sample', sample, UPSTREAM,
    why='IoUNegPiecewiseSampler waits ~5 times a call: one wait, the same random draws'))
