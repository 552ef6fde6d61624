"""Rotated NMS that computes rotated IoUs only for pairs whose bounds overlap.

mmcv 2.1's ``nms_rotated`` computes the rotated IoU of every pair of boxes: on CUDA all
n x n of them (its kernel does not skip the blocks below the diagonal), then copies an
n x n/64 bit mask to the host and walks it there; on the CPU the upper triangle, with a
tensor index per pair. Two boxes whose axis-aligned bounds are apart have, in mmcv's IoU
code (``single_box_iou_rotated``), an intersection of fewer than three points: an IoU
of exactly 0, which suppresses nothing unless the threshold admits 0. This version

1. orders the boxes of each group as upstream does: score descending; where equal scores
   make the order depend on the sort's tie-breaking, upstream's own ``sort`` calls on
   that group's scores give it;
2. finds the pairs whose bounds, widened by far more than float rounding, overlap (a
   sweep along x); boxes too thin for float32 (:data:`THIN_BOX`) pair with all;
3. computes their IoU with mmcv's ``box_iou_rotated`` (the same
   ``single_box_iou_rotated`` the NMS kernels call, with the higher-ranked box first as
   there) and compares as the device's NMS kernel does: ``iou >= thr`` on the CPU,
   ``iou > thr`` on CUDA, ``thr`` rounded to float32 (the kernels take a C ``float``);
4. finds the greedy result (a box is kept when no kept higher-ranked box suppresses it)
   in rounds over the suppressing pairs on the device, without a per-box host loop.

It falls back to mmcv's kernel, group by group, where this argument does not hold or
does not pay: a threshold that admits an IoU of 0 (CPU ``thr <= 0``, CUDA ``thr < 0``),
dtypes other than float32, devices other than CPU and CUDA, and inputs with more than
:data:`MAX_PAIRS` overlapping pairs.
"""
from typing import List, Optional, Tuple

import torch
from torch import Tensor

#: candidate pairs above which mmcv's dense kernel is used instead (memory bound).
MAX_PAIRS = 2 ** 26
#: widening of each box's bounds, relative to its scale (see :func:`_widened_bounds`).
#: mmcv computes the IoU in float32 around the pair's midpoint: its rounding moves a
#: box's edges by ~1e-7 of that scale, its directions by ~1e-7 x scale / shorter side;
#: with the widening far above both, pairs left out have an IoU of exactly 0.
BOUNDS_MARGIN = 1e-3
#: a box whose shorter side is below this x its scale pairs with every box of its
#: group: rounding turns a near-flat box's edge directions, and so its IoU, to noise.
THIN_BOX = 1e-4
_BLOCK = {'cpu': 2 ** 22, 'cuda': 2 ** 26}  # elements of one bounds-overlap block
_UNDECIDED, _KEPT, _SUPPRESSED = 0, 1, 2


def nms_rotated(boxes: Tensor, scores: Tensor, iou_threshold: float,
                groups: Optional[Tensor] = None) -> Tensor:
    """Kept indices of mmcv's ``nms_rotated`` (``[1]`` of its result), in one call for
    many groups.

    Args:
        boxes: (N, 5) rotated boxes ``(x_ctr, y_ctr, w, h, angle)``, angle in radians,
            clockwise as mmcv's default.
        scores: (N,) box scores.
        iou_threshold: suppress a box whose IoU with a kept higher-scored box is above
            it (CUDA) or at least it (CPU), as mmcv's kernel on that device does.
        groups: (N,) integer group ids (e.g. ``sample * num_classes + class``); boxes of
            different groups never suppress each other. Default: one group.

    Returns:
        int64 (K,) indices into ``boxes``: group by group in ascending id, each group's
        kept boxes in mmcv's order (score descending), equal to calling mmcv's
        ``nms_rotated`` on each group's boxes (in index order) and mapping back. Empty
        input gives an empty tensor (mmcv returns ``None`` there).
    """
    _check(boxes, scores, groups)
    return _nms(boxes, scores, iou_threshold, groups, None, None, bev=False)


def nms_bev(boxes: Tensor, scores: Tensor, thresh: float,
            pre_max_size: Optional[int] = None, post_max_size: Optional[int] = None,
            groups: Optional[Tensor] = None) -> Tensor:
    """mmdet3d 1.4's ``nms_bev`` (``mmdet3d.models.layers``), in one call for many
    groups.

    Args:
        boxes: (N, 5) BEV boxes ``(x1, y1, x2, y2, yaw)`` as mmdet3d passes them
            (``xywhr2xyxyr``); converted back to centre and size as mmdet3d does.
        scores: (N,) box scores.
        thresh: IoU threshold (see :func:`nms_rotated`).
        pre_max_size: keep at most this many highest-scored boxes of each group before
            the NMS. Default: all.
        post_max_size: return at most this many kept boxes of each group. Default: all.
        groups: (N,) integer group ids; default one group.

    Returns:
        int64 (K,) indices into ``boxes``, group by group in ascending id, each in
        mmdet3d's order. Where mmdet3d's NMS input is empty it returns an empty (1, 0)
        tensor (mmcv's ``None`` indexing); this returns an empty (0,) one.
    """
    _check(boxes, scores, groups)
    for name, value in (('pre_max_size', pre_max_size), ('post_max_size', post_max_size)):
        if value is not None and (not isinstance(value, int) or value < 0):
            raise ValueError(f'{name}={value!r}: use None (all boxes) or an int >= 0')
    return _nms(boxes, scores, thresh, groups, pre_max_size, post_max_size, bev=True)


def _check(boxes: Tensor, scores: Tensor, groups: Optional[Tensor]) -> None:
    if boxes.dim() != 2 or boxes.shape[1] != 5:
        raise ValueError(f'boxes of shape {tuple(boxes.shape)}: rotated NMS takes (N, 5)')
    if scores.shape != boxes.shape[:1]:
        raise ValueError(f'scores of shape {tuple(scores.shape)} for {boxes.shape[0]} '
                         f'boxes: pass one score a box, shape ({boxes.shape[0]},)')
    if groups is not None:
        if groups.shape != scores.shape or groups.is_floating_point() or \
                groups.dtype == torch.bool:
            raise ValueError(f'groups of shape {tuple(groups.shape)} and dtype '
                             f'{groups.dtype}: pass integer ids of shape '
                             f'({boxes.shape[0]},), or None for one group')
        if groups.device != boxes.device:
            raise ValueError(f'groups on {groups.device}, boxes on {boxes.device}: put '
                             'them on one device')


def _float32(value: float) -> float:
    """``value`` as the C ``float`` mmcv's kernels compare with."""
    return torch.tensor(float(value), dtype=torch.float32).item()


def _sparse_applies(boxes: Tensor, scores: Tensor, threshold: float) -> bool:
    """Whether pairs with apart bounds (IoU exactly 0) can be left out here."""
    device = boxes.device.type
    if device not in ('cpu', 'cuda') or scores.device != boxes.device:
        return False
    if boxes.dtype != torch.float32 or scores.dtype != torch.float32:
        return False  # mmcv's box_iou_rotated computes in float32 only
    thr = _float32(threshold)
    return thr > 0 if device == 'cpu' else thr >= 0  # also False for NaN


def _xyxyr_to_xywhr(boxes: Tensor) -> Tensor:
    """mmdet3d's ``nms_bev`` conversion, op for op (elementwise: order-independent)."""
    return torch.stack(
        ((boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2,
         boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1], boxes[:, 4]), dim=-1)


def _upstream_order(scores: Tensor, pre_max_size: Optional[int], bev: bool) -> Tensor:
    """A group's NMS order by upstream's own sort calls (their tie-breaking included):
    mmcv sorts once (its CPU kernel repeats the same call); mmdet3d's ``nms_bev`` sorts,
    cuts at ``pre_max_size`` and hands the sorted scores to mmcv, which sorts again."""
    order = scores.sort(0, descending=True)[1]
    if not bev:
        return order
    if pre_max_size is not None:
        order = order[:pre_max_size]
    return order[scores[order].sort(0, descending=True)[1]]


def _stable_ranked(scores: Tensor, groups: Optional[Tensor]
                   ) -> Tuple[Tensor, Tensor, Tensor]:
    """(order, group of each position, whether a group holds equal scores): indices
    sorted by group, then score descending, equal scores by index (no host read)."""
    order = torch.sort(scores, descending=True, stable=True)[1]
    if groups is not None:
        order = order[torch.sort(groups[order], stable=True)[1]]
        gsorted = groups[order]
    else:
        gsorted = torch.zeros_like(order)
    ranked = scores[order]
    tie = (ranked[1:] == ranked[:-1]) | (ranked[1:].isnan() & ranked[:-1].isnan())
    return order, gsorted, (tie & (gsorted[1:] == gsorted[:-1])).any()


def _upstream_ranked(scores: Tensor, groups: Optional[Tensor],
                     pre_max_size: Optional[int], bev: bool) -> Tuple[Tensor, Tensor]:
    """(order, group of each position) by upstream's sort calls, group by group: where
    equal scores make the order depend on the sort's tie-breaking."""
    if groups is None:
        order = _upstream_order(scores, pre_max_size, bev)
        return order, torch.zeros_like(order)
    values, counts = torch.unique(groups, return_counts=True)
    values, counts = torch.stack([values.long(), counts]).tolist()  # one read, all groups
    # each group's indices, ascending (what nonzero(groups == g) gives), from one sort
    members = torch.sort(groups, stable=True)[1].split(counts)
    parts, ids = [], []
    for g, idx in zip(values, members):
        part = idx[_upstream_order(scores[idx], pre_max_size, bev)]
        parts.append(part)
        ids.append(torch.full_like(part, g))
    return torch.cat(parts), torch.cat(ids)


def _cut_groups(order: Tensor, gsorted: Tensor, size: Optional[int], one_group: bool
                ) -> Tuple[Tensor, Tensor]:
    """The first ``size`` positions of each group (a slice for one group)."""
    if size is None:
        return order, gsorted
    if one_group:
        return order[:size], gsorted[:size]
    rank = torch.arange(len(order), device=order.device) - torch.searchsorted(
        gsorted, gsorted)
    head = rank < size
    return order[head], gsorted[head]


def _widened_bounds(boxes: Tensor) -> Tuple[Tensor, Tensor]:
    """(lo, hi): (M, 2) float64 axis-aligned bounds of rotated boxes, each widened by
    :data:`BOUNDS_MARGIN` x its scale ``1 + P + |w| + |h|`` (``P``: the largest finite
    ``|x| + |y|`` of all boxes, which bounds the coordinates mmcv's IoU works in). A box
    thinner than :data:`THIN_BOX` x its scale gets bounds around all boxes; a box that
    is not finite gets NaN bounds (both pair with every box of their group)."""
    b = boxes.double()
    x, y, w, h, a = b.unbind(1)
    reach = (x.abs() + y.abs()).nan_to_num(0., 0., 0.).max()
    scale = 1 + reach + w.abs() + h.abs()
    cos, sin = torch.cos(a), torch.sin(a)
    half_x = ((w * cos).abs() + (h * sin).abs()) / 2 + BOUNDS_MARGIN * scale
    half_y = ((w * sin).abs() + (h * cos).abs()) / 2 + BOUNDS_MARGIN * scale
    lo = torch.stack((x - half_x, y - half_y), 1)
    hi = torch.stack((x + half_x, y + half_y), 1)
    thin = (torch.minimum(w.abs(), h.abs()) < THIN_BOX * scale)[:, None]
    everywhere = (hi.nan_to_num(0., 0., 0.).abs().max()
                  + lo.nan_to_num(0., 0., 0.).abs().max() + 1)
    return torch.where(thin, -everywhere, lo), torch.where(thin, everywhere, hi)


def _swept_pairs(lo: Tensor, hi: Tensor, gsorted: Tensor, span: float
                 ) -> Optional[Tuple[Tensor, Tensor]]:
    """Position pairs (first < second, same group) whose finite widened bounds
    overlap; None above :data:`MAX_PAIRS`. Sorted by (group, x_lo), each box's
    x-overlapping successors are the run up to the last x_lo <= its x_hi; of these, the
    pairs that overlap in y too. ``span``: more than the x extent of all bounds."""
    # groups apart along x: the i-th group (ascending id) moved by i x span
    shift = torch.unique_consecutive(gsorted, return_inverse=True)[1].double() * span
    xlo, xhi = lo[:, 0] + shift, hi[:, 0] + shift
    xlo_sorted, by_x = torch.sort(xlo)
    xhi_sorted = xhi[by_x]
    num = len(by_x)
    start = torch.arange(num, device=lo.device)
    end = torch.searchsorted(xlo_sorted, xhi_sorted, right=True)
    counts = (end - start - 1).clamp_(min=0)
    total = int(counts.sum().item())
    if total > MAX_PAIRS:
        return None
    a = torch.repeat_interleave(start, counts, output_size=total)
    offset = torch.cumsum(counts, 0) - counts
    b = a + 1 + torch.arange(total, device=lo.device) - offset[a]
    a, b = by_x[a], by_x[b]
    overlap = ~((hi[a, 1] < lo[b, 1]) | (hi[b, 1] < lo[a, 1]))
    a, b = a[overlap], b[overlap]
    return torch.minimum(a, b), torch.maximum(a, b)


def _dense_pairs(lo: Tensor, hi: Tensor, segments: List[Tuple[int, int]]
                 ) -> Optional[Tuple[Tensor, Tensor]]:
    """Like :func:`_swept_pairs`, testing every pair of each group segment
    ``[start, end)`` in blocks: for bounds that are not finite (NaN pairs with all)."""
    block = _BLOCK.get(lo.device.type, _BLOCK['cpu'])
    first, second, total = [], [], 0
    for start, end in segments:
        rows = max(1, block // max(end - start, 1))
        for r0 in range(start, end - 1, rows):
            r1 = min(end, r0 + rows)
            apart = ((hi[r0:r1, None, 0] < lo[None, r0:end, 0])
                     | (hi[None, r0:end, 0] < lo[r0:r1, None, 0])
                     | (hi[r0:r1, None, 1] < lo[None, r0:end, 1])
                     | (hi[None, r0:end, 1] < lo[r0:r1, None, 1]))
            i, j = torch.nonzero(torch.triu(~apart, diagonal=1), as_tuple=True)
            total += len(i)
            if total > MAX_PAIRS:
                return None
            first.append(i + r0)
            second.append(j + r0)
    if not first:
        empty = torch.zeros(0, dtype=torch.long, device=lo.device)
        return empty, empty
    return torch.cat(first), torch.cat(second)


def greedy_keep(num: int, src: Tensor, dst: Tensor, active: Optional[Tensor] = None,
                rounds_per_check: int = 4) -> Tensor:
    """Greedy NMS on suppressing pairs: a position is kept when no kept earlier position
    suppresses it.

    Args:
        num: positions ``0 .. num-1`` in rank order.
        src, dst: int64 pairs with ``src < dst``: ``src`` kept suppresses ``dst``.
        active: (len(src),) bool, the pairs that suppress; default all.
        rounds_per_check: rounds between host reads (each round decides at least the
            first undecided position, typically many).

    Returns:
        (num,) bool, the kept positions.
    """
    device = src.device
    state = torch.zeros(num, dtype=torch.uint8, device=device)
    kept = torch.full_like(state, _KEPT)
    suppressed = torch.full_like(state, _SUPPRESSED)
    while len(src):
        for _ in range(rounds_per_check):
            pred = state[src]
            by_kept, by_undecided = pred == _KEPT, pred == _UNDECIDED
            if active is not None:
                by_kept, by_undecided = by_kept & active, by_undecided & active
            killed = torch.zeros(num, dtype=torch.int32, device=device).index_add_(
                0, dst, by_kept.int())
            waiting = torch.zeros(num, dtype=torch.int32, device=device).index_add_(
                0, dst, by_undecided.int())
            undecided = state == _UNDECIDED
            # suppressed: a kept predecessor; kept: every predecessor suppressed
            state = torch.where(undecided & (killed > 0), suppressed,
                                torch.where(undecided & (waiting == 0), kept, state))
        live = (state[dst] == _UNDECIDED) & (state[src] != _SUPPRESSED)
        if active is not None:
            live &= active
        live = torch.nonzero(live).squeeze(1)  # the one host read of a check
        src, dst, active = src[live], dst[live], None
    # no pair left can suppress: the undecided positions are kept
    return state != _SUPPRESSED


def _reference(boxes: Tensor, scores: Tensor, threshold: float, groups: Optional[Tensor],
               pre_max_size: Optional[int], post_max_size: Optional[int], bev: bool
               ) -> Tensor:
    """Upstream's computation, group by group (mmcv's kernel)."""
    from mmcv.ops import nms_rotated as mmcv_nms_rotated
    ids = [None] if groups is None else torch.unique(groups).tolist()
    out = []
    for g in ids:
        idx = (torch.arange(len(scores), device=scores.device) if g is None
               else torch.nonzero(groups == g).squeeze(1))
        b, s = boxes[idx], scores[idx]
        order = torch.arange(len(s), device=s.device)
        if bev:
            order = s.sort(0, descending=True)[1]
            if pre_max_size is not None:
                order = order[:pre_max_size]
            b, s = _xyxyr_to_xywhr(b[order].contiguous()), s[order]
        keep = mmcv_nms_rotated(b, s, threshold)[1]
        if keep is None:  # mmcv's answer to an empty input
            continue
        keep = order[keep]
        if post_max_size is not None:
            keep = keep[:post_max_size]
        out.append(idx[keep])
    if not out:
        return torch.zeros(0, dtype=torch.long, device=boxes.device)
    return torch.cat(out)


def _nms(boxes: Tensor, scores: Tensor, threshold: float, groups: Optional[Tensor],
         pre_max_size: Optional[int], post_max_size: Optional[int], bev: bool) -> Tensor:
    boxes, scores = boxes.detach(), scores.detach()
    if len(scores) == 0 or pre_max_size == 0:
        return torch.zeros(0, dtype=torch.long, device=boxes.device)
    if not _sparse_applies(boxes, scores, threshold):
        return _reference(boxes, scores, threshold, groups, pre_max_size, post_max_size,
                          bev)
    xywhr = _xyxyr_to_xywhr(boxes) if bev else boxes
    order, gsorted, tied = _stable_ranked(scores, groups)
    lo, hi = _widened_bounds(xywhr)
    finite = torch.isfinite(lo).all() & torch.isfinite(hi).all()
    span = (hi[:, 0].max() - lo[:, 0].min()).nan_to_num(0., 0., 0.) + 1.
    tied, finite, span = torch.stack([tied.double(), finite.double(), span]).tolist()
    if tied:
        order, gsorted = _upstream_ranked(scores, groups, pre_max_size, bev)
    else:
        order, gsorted = _cut_groups(order, gsorted, pre_max_size, groups is None)
    ranked, lo, hi = xywhr[order].contiguous(), lo[order], hi[order]
    pairs = (_swept_pairs(lo, hi, gsorted, span) if finite
             else _dense_pairs(lo, hi, _segments(gsorted)))
    if pairs is None:
        return _reference(boxes, scores, threshold, groups, pre_max_size, post_max_size,
                          bev)
    first, second = pairs
    suppresses = None
    if len(first):
        from mmcv.ops import box_iou_rotated
        ious = box_iou_rotated(ranked[first], ranked[second], aligned=True)
        thr = _float32(threshold)
        suppresses = ious >= thr if boxes.device.type == 'cpu' else ious > thr
        if boxes.device.type == 'cpu':  # host reads are free here: fewer pairs
            first, second, suppresses = first[suppresses], second[suppresses], None
    keep = torch.nonzero(greedy_keep(len(order), first, second, suppresses)).squeeze(1)
    return _cut_groups(order[keep], gsorted[keep], post_max_size, groups is None)[0]


def _segments(gsorted: Tensor) -> List[Tuple[int, int]]:
    ends = torch.cumsum(torch.unique_consecutive(gsorted, return_counts=True)[1],
                        0).tolist()
    return list(zip([0] + ends[:-1], ends))
