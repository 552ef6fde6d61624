"""``TransFusionHead`` training targets of a whole micro-batch with one host read.

Upstream builds the targets sample by sample: decode, match costs, a copy of the cost
matrix to the host for scipy's Hungarian solver, the matches back to the device, the
sampler's ``nonzero`` / ``unique`` calls, the heatmap drawn on the host and copied
back, the mean IoU read with ``float()``: about twenty host synchronisations a sample,
76 for a batch of four nuScenes frames (35 ms of an H200 idle per micro-batch).

Here the ground truth the heatmaps need starts its copy to pinned host memory first
(:class:`HeatmapJob`, which BEVFusion starts before its forward) and the heatmaps are
drawn on a host thread while the GPU runs the forward; every sample's and decoder
layer's cost matrix is computed on the device, then the costs travel to the host in one
copy, the one wait; the matches are solved there, every index the targets need is
computed on the host and sent to the device in one pinned, non-blocking copy, and the
targets are scattered on the device. The mean IoU stays a device tensor and the
heatmap's peak count is counted on the host, so nothing after the one copy waits.

Exactness: the cost matrices, the IoUs and the box encoding are the same operations
on the same values as the per-sample path (:meth:`TransFusionHead.targets_per_sample`),
scipy receives the same numbers (float64 holds every float32 / float16 value), and
the matches land in the same order as ``PseudoSampler``'s sorted ``nonzero``. Tests
compare the two paths for equality.
"""
import threading
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch
from mmengine.structures import InstanceData
from torch import Tensor

from ...utils.device_copy import HostCopy, to_device
from .assigners import solve_matching


class MatchCosts(NamedTuple):
    """The device side of one micro-batch before the host read."""
    boxes: List[Tensor]  # per sample: [L*P, D] decoded proposals
    gt_boxes: List[Tensor]  # per sample: [G, D]
    gt_labels: List[Tensor]  # per sample: [G]
    costs: List[Tensor]  # per layer: [B*P, G_1 + ... + G_B], sample b's block its costs
    ious: List[Tensor]  # the same: IoUs


def match_costs(head, gts: Sequence[InstanceData], preds: Dict[str, Tensor]) -> MatchCosts:
    """Decode every sample's proposals and compute each layer's match cost on the device.

    One cost computation a decoder layer for the whole batch: every proposal against
    every sample's ground truth (``[B*P, G_1 + ... + G_B]``), of which each sample's
    block is its cost matrix. Every entry is an elementwise function of one proposal
    and one box (focal cost, L1 centre distance, rotated BEV and height overlap), so a
    block holds the per-sample computation's values; the blocks of other samples are a
    little wasted work (hundreds of proposals by tens of boxes) instead of a round of
    some sixty launches a sample.
    """
    score = preds['heatmap'].detach()
    decoded = head.bbox_coder.decode(
        score, preds['rot'].detach(), preds['dim'].detach(), preds['center'].detach(),
        preds['height'].detach(), preds['vel'].detach() if 'vel' in preds else None)
    boxes = [d['bboxes'] for d in decoded]
    gt_boxes = [g.bboxes_3d.tensor.to(b) for g, b in zip(gts, boxes)]
    gt_labels = [g.labels_3d.to(b.device) for g, b in zip(gts, boxes)]
    per_layer = [_batch_cost(head, [b[sl] for b in boxes], gt_boxes, gt_labels,
                             score[..., sl]) for sl in head.layer_slices()]
    return MatchCosts(boxes, gt_boxes, gt_labels, [c for c, _ in per_layer],
                      [i for _, i in per_layer])


def _batch_cost(head, boxes: Sequence[Tensor], gt_boxes: Sequence[Tensor],
                gt_labels: Sequence[Tensor], score: Tensor) -> Tuple[Tensor, Tensor]:
    """One layer's ``[B*P, G_1 + ... + G_B]`` cost and IoU of every proposal against
    every sample's boxes (``score``: ``[B, K, P]`` logits of that layer)."""
    flat = torch.cat(list(boxes))
    gt = torch.cat(list(gt_boxes))
    if len(flat) == 0 or len(gt) == 0:  # no matching anywhere: as the empty case
        empty = flat.new_zeros(len(flat), len(gt))
        return empty, empty
    return head.bbox_assigner.match_cost(
        flat, gt, torch.cat(list(gt_labels)), torch.cat(list(score), dim=1)[None],
        head.train_cfg)


def heatmap_boxes(gts: Sequence[InstanceData]) -> Tensor:
    """``[G_1 + ... + G_B, 8 or 10]``: every sample's boxes as gravity centre, sizes, yaw
    (, velocity), label, sample after sample (one computation for the batch)."""
    first = gts[0].bboxes_3d
    boxes = type(first)(torch.cat([g.bboxes_3d.tensor for g in gts]),
                        box_dim=first.box_dim, with_yaw=first.with_yaw)
    labels = torch.cat([g.labels_3d for g in gts])
    return torch.cat([boxes.gravity_center, boxes.tensor[:, 3:],
                      labels[:, None].to(boxes.tensor)], dim=1)


def to_host(parts: Sequence[Tensor]) -> List[np.ndarray]:
    """One device-to-host copy of many tensors, as float64 arrays of their shapes."""
    if not parts:
        return []
    flat = torch.cat([p.detach().reshape(-1).double() for p in parts]).cpu().numpy()
    out, start = [], 0
    for p in parts:
        out.append(flat[start:start + p.numel()].reshape(p.shape))
        start += p.numel()
    return out


class HostMatches(NamedTuple):
    """Where the matches put targets, as flat indices of the ``[B, L*P]`` targets."""
    pos: np.ndarray  # positive proposals, sample-major, ascending within a sample
    gt: np.ndarray  # their gt box, an index into the concatenated gt boxes
    iou: np.ndarray  # their IoU, an index into the layers' flattened IoU matrices
    num_pos: List[int]  # per sample


def solve(costs: Sequence[np.ndarray], num_gts: Sequence[int],
          num_proposals: int) -> HostMatches:
    """Hungarian matches of every (sample, layer) block of the layers' host cost
    matrices (``[B*P, G_1 + ... + G_B]`` each), as flat target indices."""
    pos, gt, iou, num_pos = [], [], [], []
    num_layers, total = len(costs), sum(num_gts)
    gt_offset = 0
    for b, g in enumerate(num_gts):
        count = 0
        rows_of_b = slice(b * num_proposals, (b + 1) * num_proposals)
        for layer, layer_cost in enumerate(costs):
            if g and num_proposals:
                rows, cols = solve_matching(layer_cost[rows_of_b, gt_offset:gt_offset + g])
                pos.append((b * num_layers + layer) * num_proposals + rows)
                gt.append(gt_offset + cols)
                iou.append(layer_cost.size * layer
                           + (b * num_proposals + rows) * total + gt_offset + cols)
                count += len(rows)
        gt_offset += g
        num_pos.append(count)

    def cat(xs):
        return np.concatenate(xs).astype(np.int64) if xs else np.zeros(0, np.int64)
    return HostMatches(cat(pos), cat(gt), cat(iou), num_pos)


def heatmap_cells_of_batch(head, boxes: np.ndarray, num_gts: Sequence[int],
                           cuda: bool) -> Tuple[np.ndarray, np.ndarray]:
    """Set cells (flat indices into ``[B, K, X, Y]``, values) of the batch's heatmaps,
    drawn on the host from its ``heatmap_boxes`` in one pass over all boxes
    (:func:`.heatmap_targets.heatmap_cells`; the geometry is elementwise, so a batch's
    boxes get the values they get sample by sample)."""
    # NumPy: a torch operator wakes the intra-op pool (repeat_interleave took 11.2 ms
    # on the main thread beside 8 loader workers, call J1)
    maps = torch.from_numpy(np.repeat(np.arange(len(num_gts)), num_gts))
    return head.heatmap_target_cells(torch.from_numpy(boxes.astype(np.float32)), cuda,
                                     maps=maps)


class HeatmapJob:
    """A batch's heatmap targets, drawn on the host while the GPU runs the forward.

    Started before the forward: on a GPU a host thread draws the set cells while the
    main thread queues the forward; the drawing had taken 16 ms of a host busy with
    loader workers after the GPU had run out of work (call H2). The boxes are the
    loader's host copy where the data preprocessor kept one (``host_gts``); else they
    start for pinned host memory and the thread waits for that copy. The thread's wait is
    safe beside a CUDA graph capture: captures run in ``thread_local`` mode
    (:mod:`mmdet3d_scaling.models.cuda_graphs`). On the CPU the cells are drawn when
    :meth:`heatmaps` asks for them.

    Args:
        head: the ``TransFusionHead`` (its train_cfg and heatmap shape).
        gts (list[InstanceData]): the batch's ground truth.
        host_gts (list[InstanceData], optional): the same on the host, as the loader
            made it (:mod:`.host_ground_truth`): then nothing is copied back and the
            drawing starts at once (the copy had waited 37-41 ms behind the previous
            step's work, call I1). Not used where its box counts differ from ``gts``.
        on_thread (bool): on a GPU, draw on a host thread (default True); False: when
            :meth:`heatmaps` asks, as on the CPU.
    """

    def __init__(self, head, gts: Sequence[InstanceData],
                 host_gts: Optional[Sequence[InstanceData]] = None,
                 on_thread: bool = True) -> None:
        self.head = head
        self.num_gts = [int(g.bboxes_3d.tensor.shape[0]) for g in gts]
        self.device = gts[0].labels_3d.device
        if host_gts is not None and [len(g.bboxes_3d) for g in host_gts] != self.num_gts:
            host_gts = None
        self.from_host = host_gts is not None
        self.boxes = HostCopy(heatmap_boxes(host_gts if self.from_host else gts))
        self._outcome: Dict[str, object] = {}
        self._thread = None
        if self.device.type == 'cuda' and on_thread:
            self._thread = threading.Thread(target=self._draw, name='heatmap-targets',
                                            daemon=True)
            self._thread.start()

    def _draw(self) -> None:
        try:
            self._outcome['cells'] = heatmap_cells_of_batch(
                self.head, self.boxes.numpy(), self.num_gts, self.device.type == 'cuda')
        except BaseException as err:  # raised again on the main thread
            self._outcome['error'] = err

    def heatmaps(self) -> Tuple[Tensor, int]:
        """``[B, K, X, Y]`` heatmaps on the boxes' device and their number of peaks
        (cells equal to 1): the cells in one small copy, written into zeros there (the
        dense maps, 5 MB for four nuScenes frames, took about 15 ms to pin, call H2)."""
        if self._thread is None:
            self._draw()
        else:
            self._thread.join()
        if 'error' in self._outcome:
            raise self._outcome['error']
        cells, values = self._outcome['cells']
        shape = (len(self.num_gts), *self.head.heatmap_shape())
        # one copy: the float32 values ride along as their bits, in int64 slots
        packed = to_device(torch.from_numpy(
            np.concatenate([cells, values.view(np.int32).astype(np.int64)])), self.device)
        heatmap = torch.zeros(int(np.prod(shape)), dtype=torch.float32, device=self.device)
        n = len(cells)
        heatmap[packed[:n]] = packed[n:].to(torch.int32).view(torch.float32)
        return heatmap.view(shape), int(np.count_nonzero(values == 1))


def scatter_targets(head, dev: MatchCosts, matches: HostMatches,
                    batch: int) -> Tuple[Tensor, ...]:
    """Labels, label weights, box targets, box weights and IoUs ``[B, L*P(, code)]``
    from the host's match indices (one host-to-device copy)."""
    boxes = dev.boxes[0]
    device, total = boxes.device, head.layer_slices()[-1].stop
    index = to_device(torch.from_numpy(
        np.concatenate([matches.pos, matches.gt, matches.iou])), device)
    n = len(matches.pos)
    pos, gt, iou_at = index[:n], index[n:2 * n], index[2 * n:]

    code = head.bbox_coder.code_size
    gt_boxes = torch.cat(dev.gt_boxes)
    gt_labels = torch.cat(dev.gt_labels)
    labels = torch.full((batch * total, ), head.num_classes, dtype=torch.long,
                        device=device)
    labels[pos] = gt_labels[gt]
    pos_weight = head.train_cfg['pos_weight']
    label_weights = boxes.new_ones(batch * total)
    # index_fill_, not ``[pos] = scalar``: a Python scalar is copied to the GPU from
    # pageable memory, which waits for the queue
    label_weights.index_fill_(0, pos, 1.0 if pos_weight <= 0 else pos_weight)
    bbox_targets = boxes.new_zeros(batch * total, code)
    bbox_targets[pos] = head.bbox_coder.encode(gt_boxes[gt])
    bbox_weights = boxes.new_zeros(batch * total, code)
    bbox_weights.index_fill_(0, pos, 1.0)
    ious = boxes.new_zeros(batch * total)
    if n:
        ious[pos] = torch.cat([i.reshape(-1) for i in dev.ious])[iou_at].to(ious.dtype)
    ious = ious.clamp(min=0.0, max=1.0)
    return (labels.view(batch, total), label_weights.view(batch, total),
            bbox_targets.view(batch, total, code), bbox_weights.view(batch, total, code),
            ious.view(batch, total))


def mean_matched_iou(ious: Tensor, num_pos: Sequence[int]) -> Tensor:
    """Mean over samples of each sample's mean IoU of its matches (a device tensor)."""
    sums = ious.sum(dim=1)  # unmatched proposals hold 0
    counts = torch.tensor([max(n, 1) for n in num_pos], dtype=ious.dtype)
    return (sums / to_device(counts, ious.device)).mean()


def batch_targets(head, gts: Sequence[InstanceData], preds: Dict[str, Tensor],
                  heatmaps: Optional[HeatmapJob] = None) -> Tuple:
    """``TransFusionHead.get_targets`` for ``HungarianAssigner3D`` with ``PseudoSampler``.

    Args:
        heatmaps: the batch's :class:`HeatmapJob`, started before the forward (the
            heatmaps are then drawn while the GPU runs it); default: started here,
            before the match costs.

    Returns:
        tuple: labels ``[B, L*P]``, label_weights, bbox_targets ``[B, L*P, code]``,
        bbox_weights, ious ``[B, L*P]``, num_pos (int), matched_ious (0-dim tensor),
        heatmap ``[B, K, X, Y]``, heatmap peaks (int).
    """
    if heatmaps is None:
        heatmaps = HeatmapJob(head, gts)
    dev = match_costs(head, gts, preds)
    num_gts = [len(g) for g in dev.gt_boxes]
    # the ground truth alone decides the heatmaps: on the device before the read of
    # the costs, while the GPU still computes them
    heatmap, peaks = heatmaps.heatmaps()
    matches = solve(to_host(dev.costs), num_gts, head.num_proposals)  # the one wait
    targets = scatter_targets(head, dev, matches, len(gts))
    return (*targets, sum(matches.num_pos), mean_matched_iou(targets[4], matches.num_pos),
            heatmap, peaks)


__all__ = ['HeatmapJob', 'batch_targets']
