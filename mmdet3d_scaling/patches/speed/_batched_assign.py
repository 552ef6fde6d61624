"""``MaxIoUAssigner``'s rules for a whole batch at once, on padded, masked IoUs (shared by
the ``anchor_targets`` and ``roi_assign`` patches)."""
from typing import List, Sequence, Tuple

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

# The most (ground truth, prior) pairs one batched IoU may hold: 2**25 float32 values are
# 128 MiB a tensor, and an IoU takes a handful of them. Larger batches go in chunks.
MAX_PAIRS = 2**25


def sample_chunks(batch: int, pairs_a_sample: int) -> List[slice]:
    """Consecutive sample ranges whose IoUs hold at most ``MAX_PAIRS`` pairs each (one
    sample at least)."""
    step = max(1, MAX_PAIRS // max(1, pairs_a_sample))
    return [slice(lo, min(lo + step, batch)) for lo in range(0, batch, step)]


def real_rows(rows: Sequence[Tensor]) -> Tensor:
    """(B, N) bool: which rows of the samples' ``rows`` padded to the longest are real."""
    return pad_sequence([r.new_ones(len(r), dtype=torch.bool) for r in rows],
                        batch_first=True)


def assign_masked(assigner, overlaps: Tensor, valid: Tensor) -> Tuple[Tensor, Tensor]:
    """``gt_inds`` and ``max_overlaps`` of ``assigner`` (a ``MaxIoUAssigner``) for every
    sample at once.

    Args:
        overlaps: (B, G, A) IoU of each sample's (padded) ground truths with its priors.
        valid: (B, G, A) or (B, G, 1) bool: the pairs the assigner would see, i.e. the
            ground truths it is given for a prior (padding and other classes left out).

    Returns:
        gt_inds (B, A): -1 ignore, 0 background, k the sample's k-th ground truth
        (1-based), as the assigner gives it given the valid ground truths alone;
        max_overlaps (B, A): the largest valid IoU. A prior without any valid ground truth
        gets 0 and 0, as upstream's assigner does for an empty ground-truth set.
    """
    overlaps = overlaps.masked_fill(~valid, -1)  # never a max, never a match
    max_overlaps, argmax_overlaps = overlaps.max(dim=1)
    gt_max, gt_argmax = overlaps.max(dim=2)
    gt_inds = torch.full_like(argmax_overlaps, -1)
    neg_thr = assigner.neg_iou_thr
    if isinstance(neg_thr, float):
        gt_inds = torch.where((max_overlaps >= 0) & (max_overlaps < neg_thr), 0, gt_inds)
    elif isinstance(neg_thr, tuple):
        low, high = neg_thr
        gt_inds = torch.where((max_overlaps >= low) & (max_overlaps < high), 0, gt_inds)
    gt_inds = torch.where(max_overlaps >= assigner.pos_iou_thr, argmax_overlaps + 1,
                          gt_inds)
    if assigner.match_low_quality:  # later gts win where the upstream loop overwrites
        ids = torch.arange(1, overlaps.size(1) + 1, device=overlaps.device)
        ids = torch.where(valid.any(dim=2) & (gt_max >= assigner.min_pos_iou), ids, 0)
        if assigner.gt_max_assign_all:
            at_best = (overlaps == gt_max[..., None]) & valid
            matched = torch.where(at_best, ids[..., None].int(), 0).amax(dim=1).long()
        else:
            matched = torch.zeros_like(gt_inds).scatter_reduce(1, gt_argmax, ids, 'amax')
        gt_inds = torch.where(matched > 0, matched, gt_inds)
    has_gt = valid.any(dim=1)
    return (torch.where(has_gt, gt_inds, 0),
            torch.where(has_gt, max_overlaps, torch.zeros_like(max_overlaps)))
