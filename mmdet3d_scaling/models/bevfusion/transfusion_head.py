"""``TransFusionHead``: heatmap proposals refined by a transformer decoder.

Same parameters and outputs as mmdet3d 1.4's ``projects/BEVFusion`` head (names and
shapes match the official checkpoints). Behaviour differences, all where upstream
would fail: several decoder layers with auxiliary losses work; frames without ground
truth train (all proposals background); ``nms_kernel_size=1`` works; non-square BEV
grids get heatmap targets of the right shape; no state is kept between forward and
predict (the proposals' classes travel in the output dict as ``query_labels``).
"""
import copy
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from mmcv.cnn import ConvModule, build_conv_layer
from mmdet.models.losses import FocalLoss, L1Loss
from mmdet.models.losses.smooth_l1_loss import l1_loss
from mmdet.models.task_modules import AssignResult, PseudoSampler
from mmengine.structures import InstanceData
from torch import Tensor, nn

from mmdet3d.models.dense_heads.centerpoint_head import SeparateHead
from mmdet3d.models.layers import circle_nms, nms_bev
from mmdet3d.registry import MODELS, TASK_UTILS
from mmdet3d.structures import xywhr2xyxyr
from mmdet3d_scaling.registry import register
from .assigners import HeuristicAssigner3D, HungarianAssigner3D
from .heatmap_targets import box_centres_and_radii, draw_heatmap_array, heatmap_cells
from .host_ground_truth import host_ground_truth
from .hungarian_targets import HeatmapJob, batch_targets

# Keys of the forward output that are not per-proposal-per-layer.
_SHARED_KEYS = ('dense_heatmap', 'query_heatmap_score', 'query_labels')

# Classes whose local-maximum search uses a 1x1 window, and the NMS tasks of predict.
_SMALL_CLASSES = {'nuScenes': (8, 9), 'Waymo': (1, 2)}
_NMS_TASKS = {
    'nuScenes': [dict(indices=list(range(8)), radius=-1),
                 dict(indices=[8], radius=0.175),
                 dict(indices=[9], radius=0.175)],
    'Waymo': [dict(indices=[0], radius=0.7), dict(indices=[1], radius=0.7),
              dict(indices=[2], radius=0.7)],
}


def clip_sigmoid(x: Tensor, eps: float = 1e-4) -> Tensor:
    """Sigmoid clamped to [eps, 1 - eps] (not in place)."""
    return x.sigmoid().clamp(min=eps, max=1 - eps)


@register(MODELS)
class TransFusionHead(nn.Module):
    """TransFusion detection head (LiDAR-only or fused BEV features).

    Args:
        num_proposals (int): object queries per sample. Defaults to 128.
        auxiliary (bool): supervise every decoder layer. Defaults to True.
        in_channels (int): BEV feature channels. Defaults to 384.
        hidden_channel (int): query / key channels. Defaults to 128.
        num_classes (int): object classes. Defaults to 4.
        num_decoder_layers (int): transformer decoder layers. Defaults to 3.
        decoder_layer (dict): ``TransformerDecoderLayer`` config.
        num_heads (int): kept for config compatibility (the layer config sets it).
        nms_kernel_size (int): window of the heatmap local-maximum search (odd).
            Defaults to 1.
        bn_momentum (float): momentum of every BN of the head. Defaults to 0.1.
        common_heads (dict): regression heads, name -> (channels, num_convs).
        num_heatmap_convs (int): convs of the per-query class head. Defaults to 2.
        conv_cfg (dict): conv of the prediction heads. Defaults to Conv1d.
        norm_cfg (dict): norm of the prediction heads. Defaults to BN1d.
        bias (str | bool): conv bias ('auto': none before a norm). Defaults to 'auto'.
        loss_cls, loss_bbox, loss_heatmap (dict): loss configs.
        train_cfg (dict): targets and assignment: dataset, point_cloud_range,
            grid_size, voxel_size, out_size_factor, gaussian_overlap, min_radius,
            pos_weight, code_weights, assigner.
        test_cfg (dict): dataset, grid_size, out_size_factor, nms_type (None,
            'circle' or 'rotate'), and pre_maxsize / post_maxsize for 'rotate'.
        bbox_coder (dict): ``TransFusionBBoxCoder`` config.
        heatmaps_on_thread (bool): on a GPU, draw the heatmap targets on a host thread
            beside the forward (True), or on the main thread when the loss needs them
            (False; the same targets). Defaults to True.
    """

    def __init__(self,
                 num_proposals: int = 128,
                 auxiliary: bool = True,
                 in_channels: int = 128 * 3,
                 hidden_channel: int = 128,
                 num_classes: int = 4,
                 num_decoder_layers: int = 3,
                 decoder_layer: dict = dict(),
                 num_heads: int = 8,
                 nms_kernel_size: int = 1,
                 bn_momentum: float = 0.1,
                 common_heads: dict = dict(),
                 num_heatmap_convs: int = 2,
                 conv_cfg: dict = dict(type='Conv1d'),
                 norm_cfg: dict = dict(type='BN1d'),
                 bias='auto',
                 loss_cls: dict = dict(type='mmdet.GaussianFocalLoss', reduction='mean'),
                 loss_bbox: dict = dict(type='mmdet.L1Loss', reduction='mean'),
                 loss_heatmap: dict = dict(type='mmdet.GaussianFocalLoss',
                                           reduction='mean'),
                 train_cfg: Optional[dict] = None,
                 test_cfg: Optional[dict] = None,
                 bbox_coder: Optional[dict] = None,
                 heatmaps_on_thread: bool = True) -> None:
        super().__init__()
        self.heatmaps_on_thread = bool(heatmaps_on_thread)
        if test_cfg is None or 'grid_size' not in test_cfg:
            raise ValueError('TransFusionHead needs test_cfg with grid_size, '
                             'out_size_factor and dataset (also used in training).')
        if nms_kernel_size < 1 or nms_kernel_size % 2 == 0:
            raise ValueError(f'nms_kernel_size={nms_kernel_size} must be odd and >= 1.')
        self.num_proposals = num_proposals
        self.auxiliary = auxiliary
        self.in_channels = in_channels
        self.num_heads = num_heads
        self.num_decoder_layers = num_decoder_layers
        self.bn_momentum = bn_momentum
        self.nms_kernel_size = nms_kernel_size
        self.train_cfg = train_cfg
        self.test_cfg = test_cfg

        self.use_sigmoid_cls = loss_cls.get('use_sigmoid', False)
        self.num_classes = num_classes + (0 if self.use_sigmoid_cls else 1)
        self.loss_cls = MODELS.build(loss_cls)
        self.loss_bbox = MODELS.build(loss_bbox)
        self.loss_heatmap = MODELS.build(loss_heatmap)
        self.bbox_coder = TASK_UTILS.build(bbox_coder)

        self.shared_conv = build_conv_layer(
            dict(type='Conv2d'), in_channels, hidden_channel, kernel_size=3, padding=1,
            bias=bias)
        self.heatmap_head = nn.Sequential(
            ConvModule(hidden_channel, hidden_channel, kernel_size=3, padding=1,
                       bias=bias, conv_cfg=dict(type='Conv2d'),
                       norm_cfg=dict(type='BN2d')),
            build_conv_layer(dict(type='Conv2d'), hidden_channel, num_classes,
                             kernel_size=3, padding=1, bias=bias))
        self.class_encoding = nn.Conv1d(num_classes, hidden_channel, 1)
        self.decoder = nn.ModuleList(
            [MODELS.build(copy.deepcopy(decoder_layer)) for _ in range(num_decoder_layers)])
        self.prediction_heads = nn.ModuleList()
        for _ in range(num_decoder_layers):
            heads = copy.deepcopy(dict(common_heads))
            heads['heatmap'] = (self.num_classes, num_heatmap_convs)
            self.prediction_heads.append(
                SeparateHead(hidden_channel, heads, conv_cfg=conv_cfg, norm_cfg=norm_cfg,
                             bias=bias))

        self.init_weights()
        self._init_assigner_sampler()
        self._code_weights: Dict[tuple, Tensor] = {}
        x_size = test_cfg['grid_size'][0] // test_cfg['out_size_factor']
        y_size = test_cfg['grid_size'][1] // test_cfg['out_size_factor']
        # Cell centres of the BEV map in feature-map units, x-major like the map.
        self.register_buffer('bev_pos', self.create_2D_grid(x_size, y_size),
                             persistent=False)

    @staticmethod
    def create_2D_grid(x_size: int, y_size: int) -> Tensor:
        """``[1, x_size * y_size, 2]`` cell centres (x + 0.5, y + 0.5), x-major."""
        xs = torch.arange(x_size, dtype=torch.float32) + 0.5
        ys = torch.arange(y_size, dtype=torch.float32) + 0.5
        grid_x, grid_y = torch.meshgrid(xs, ys, indexing='ij')
        return torch.stack([grid_x, grid_y], dim=-1).view(1, -1, 2)

    def init_weights(self) -> None:
        """Xavier init of the decoder's matrices; BN momentum of the whole head."""
        for p in self.decoder.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        for m in self.modules():
            if isinstance(m, (nn.BatchNorm2d, nn.BatchNorm1d)):
                m.momentum = self.bn_momentum

    def _init_assigner_sampler(self) -> None:
        if self.train_cfg is None:
            return
        self.bbox_sampler = PseudoSampler()
        assigner = self.train_cfg['assigner']
        if isinstance(assigner, (list, tuple)):
            raise ValueError('TransFusionHead takes one assigner config, not a list.')
        self.bbox_assigner = TASK_UTILS.build(assigner)

    # ------------------------------------------------------------------ forward

    def _local_maxima(self, heatmap: Tensor) -> Tensor:
        """Keep heatmap values that are the maximum of their window, zero the rest.

        As upstream, the border of width kernel//2 is suppressed, and the small classes
        of the dataset use a 1x1 window (every cell is its own maximum).
        """
        pad = self.nms_kernel_size // 2
        if pad == 0:
            return heatmap
        local_max = torch.zeros_like(heatmap)
        local_max[:, :, pad:-pad, pad:-pad] = F.max_pool2d(
            heatmap, kernel_size=self.nms_kernel_size, stride=1, padding=0)
        for cls in _SMALL_CLASSES.get(self.test_cfg.get('dataset'), ()):
            local_max[:, cls] = heatmap[:, cls]
        return heatmap * (heatmap == local_max)

    def forward_single(self, inputs: Tensor, metas: Optional[List[dict]] = None) -> List[dict]:
        """Proposals and their refinement for one BEV map ``[B, C, X, Y]``.

        Returns:
            list[dict]: one dict with, per proposal (concatenated over the supervised
            decoder layers along the last dim): center ``[B, 2, L*P]``, height, dim,
            rot, vel, heatmap (class logits); and query_heatmap_score ``[B, K, P]``,
            query_labels ``[B, P]``, dense_heatmap ``[B, K, X, Y]``.
        """
        batch_size = inputs.shape[0]
        fusion_feat = self.shared_conv(inputs)
        feat_flat = fusion_feat.flatten(2)  # [B, C, X*Y]
        bev_pos = self.bev_pos.to(fusion_feat.dtype).expand(batch_size, -1, -1)
        if bev_pos.shape[1] != feat_flat.shape[-1]:
            raise ValueError(
                f'BEV map {tuple(inputs.shape[-2:])} does not match test_cfg grid_size '
                f'{self.test_cfg["grid_size"][:2]} // out_size_factor '
                f'{self.test_cfg["out_size_factor"]}; make them agree.')

        with torch.autocast(device_type=inputs.device.type, enabled=False):
            dense_heatmap = self.heatmap_head(fusion_feat.float())
        heatmap = self._local_maxima(dense_heatmap.detach().sigmoid()).flatten(2)

        num_cells = heatmap.shape[-1]
        top = heatmap.view(batch_size, -1).argsort(dim=-1, descending=True)
        top = top[..., :self.num_proposals]
        query_labels = top // num_cells
        query_index = top % num_cells

        query_feat = feat_flat.gather(
            -1, query_index[:, None, :].expand(-1, feat_flat.shape[1], -1))
        one_hot = F.one_hot(query_labels, num_classes=self.num_classes).permute(0, 2, 1)
        query_feat = query_feat + self.class_encoding(one_hot.to(query_feat.dtype))
        query_pos = bev_pos.gather(1, query_index[..., None].expand(-1, -1, 2))

        layer_outputs = []
        for decoder, pred_head in zip(self.decoder, self.prediction_heads):
            query_feat = decoder(query_feat, key=feat_flat, query_pos=query_pos,
                                 key_pos=bev_pos)
            res = pred_head(query_feat)
            res['center'] = res['center'] + query_pos.permute(0, 2, 1)
            layer_outputs.append(res)
            query_pos = res['center'].detach().clone().permute(0, 2, 1)

        supervised = layer_outputs if self.auxiliary else layer_outputs[-1:]
        out = {key: torch.cat([r[key] for r in supervised], dim=-1)
               for key in supervised[0]}
        out['query_heatmap_score'] = heatmap.gather(
            -1, query_index[:, None, :].expand(-1, self.num_classes, -1))
        out['query_labels'] = query_labels
        out['dense_heatmap'] = dense_heatmap
        return [out]

    def forward(self, feats, metas: Optional[List[dict]] = None) -> Tuple[List[dict]]:
        """Head on one BEV map (a tensor or a one-element list).

        Returns:
            tuple: ``([dict],)``, upstream's layout: preds[0][0] is the dict of
            :meth:`forward_single`.
        """
        if isinstance(feats, (list, tuple)):
            if len(feats) != 1:
                raise ValueError(f'TransFusionHead takes one feature level, got '
                                 f'{len(feats)}; fuse the neck outputs first.')
            feats = feats[0]
        return (self.forward_single(feats, metas), )

    # ------------------------------------------------------------------ predict

    def predict(self, batch_feats, batch_input_metas: List[dict]) -> List[InstanceData]:
        return self.predict_by_feat(self(batch_feats, batch_input_metas),
                                    batch_input_metas)

    def predict_by_feat(self, preds_dicts, metas: List[dict], **kwargs) -> List[InstanceData]:
        """Decode the last decoder layer's proposals into boxes per sample.

        Returns:
            list[InstanceData]: bboxes_3d (``metas[i]['box_type_3d']``), scores_3d,
            labels_3d.
        """
        preds = preds_dicts[0][0]
        last = slice(-self.num_proposals, None)
        one_hot = F.one_hot(preds['query_labels'],
                            num_classes=self.num_classes).permute(0, 2, 1)
        scores = preds['heatmap'][..., last].sigmoid() * preds['query_heatmap_score'] \
            * one_hot
        decoded = self.bbox_coder.decode(
            scores, preds['rot'][..., last], preds['dim'][..., last],
            preds['center'][..., last], preds['height'][..., last],
            preds['vel'][..., last] if 'vel' in preds else None, filter=True)

        results = []
        for i, det in enumerate(decoded):
            if self.test_cfg.get('nms_type') is not None:
                det = self._nms(det, metas[i])
            instances = InstanceData()
            instances.bboxes_3d = metas[i]['box_type_3d'](
                det['bboxes'], box_dim=det['bboxes'].shape[-1])
            instances.scores_3d = det['scores']
            instances.labels_3d = det['labels'].int()
            results.append(instances)
        return results

    def _nms(self, det: Dict[str, Tensor], meta: dict) -> Dict[str, Tensor]:
        """Per-task NMS (circle or rotated BEV) as in upstream's test_cfg."""
        dataset = self.test_cfg.get('dataset')
        if dataset not in _NMS_TASKS:
            raise ValueError(f"test_cfg nms_type={self.test_cfg['nms_type']!r} needs "
                             f"dataset in {sorted(_NMS_TASKS)}, got {dataset!r}.")
        boxes, scores, labels = det['bboxes'], det['scores'], det['labels']
        keep = torch.zeros_like(scores, dtype=torch.bool)
        for task in _NMS_TASKS[dataset]:
            task_mask = torch.zeros_like(keep)
            for cls in task['indices']:
                task_mask |= labels == cls
            idx = torch.nonzero(task_mask).squeeze(1)
            if task['radius'] <= 0 or idx.numel() == 0:
                keep[idx] = True
                continue
            if self.test_cfg['nms_type'] == 'circle':
                dets = torch.cat([boxes[idx, :2], scores[idx, None]], dim=1)
                kept = torch.as_tensor(
                    circle_nms(dets.detach().cpu().numpy(), task['radius']),
                    dtype=torch.long)
            else:
                bev = xywhr2xyxyr(meta['box_type_3d'](boxes[idx, :7], 7).bev)
                kept = nms_bev(bev, scores[idx], thresh=task['radius'],
                               pre_max_size=self.test_cfg['pre_maxsize'],
                               post_max_size=self.test_cfg['post_maxsize'])
            keep[idx[kept.to(idx.device)]] = True
        return dict(bboxes=boxes[keep], scores=scores[keep], labels=labels[keep])

    # ------------------------------------------------------------------ training

    @property
    def _num_layers_supervised(self) -> int:
        return self.num_decoder_layers if self.auxiliary else 1

    def layer_slices(self) -> List[slice]:
        """Each supervised decoder layer's proposals along the last dim of the preds."""
        p = self.num_proposals
        return [slice(i * p, (i + 1) * p) for i in range(self._num_layers_supervised)]

    def get_targets(self, batch_gt_instances_3d: List[InstanceData],
                    preds: Dict[str, Tensor],
                    heatmaps: Optional[HeatmapJob] = None) -> Tuple:
        """Targets for a batch; ``preds`` is the dict of :meth:`forward_single`;
        ``heatmaps``: the batch's heatmap targets already being drawn (batch path only;
        see :meth:`start_heatmap_targets`).

        With the Hungarian assigner (the official configs) the whole batch is matched
        with one host read (:mod:`.hungarian_targets`); other assigners go sample by
        sample (:meth:`targets_per_sample`). Both return the same values.

        Returns:
            tuple: labels ``[B, L*P]``, label_weights, bbox_targets ``[B, L*P, code]``,
            bbox_weights, ious ``[B, L*P]``, num_pos (int), matched_ious (0-dim
            tensor), heatmap ``[B, K, X, Y]``, heatmap peaks (int: cells equal to 1).
        """
        if self._targets_in_batch():
            return batch_targets(self, batch_gt_instances_3d, preds, heatmaps)
        return self.targets_per_sample(batch_gt_instances_3d, preds)

    def _targets_in_batch(self) -> bool:
        """Whether :meth:`get_targets` takes the one-read batch path."""
        return (isinstance(self.bbox_assigner, HungarianAssigner3D)
                and type(self.bbox_sampler) is PseudoSampler)

    def targets_per_sample(self, batch_gt_instances_3d: List[InstanceData],
                           preds: Dict[str, Tensor]) -> Tuple:
        """:meth:`get_targets` one sample at a time, as upstream builds them."""
        per_sample = []
        for b, gt in enumerate(batch_gt_instances_3d):
            sample_preds = {k: v[b:b + 1] for k, v in preds.items()
                            if k not in _SHARED_KEYS}
            per_sample.append(self.get_targets_single(
                gt, sample_preds, preds['query_labels'][b]))
        fields = list(zip(*per_sample))
        heatmap = torch.cat(fields[7])
        return (torch.cat(fields[0]), torch.cat(fields[1]), torch.cat(fields[2]),
                torch.cat(fields[3]), torch.cat(fields[4]), int(np.sum(fields[5])),
                heatmap.new_tensor(float(np.mean(fields[6]))), heatmap,
                int(heatmap.eq(1).sum().item()))

    def _assign(self, boxes: Tensor, scores: Tensor, gt_boxes: Tensor, gt_labels: Tensor,
                query_labels: Tensor) -> AssignResult:
        """Assign each supervised layer's proposals separately, then concatenate."""
        results = []
        for sl in self.layer_slices():
            if isinstance(self.bbox_assigner, HungarianAssigner3D):
                res = self.bbox_assigner.assign(boxes[sl], gt_boxes, gt_labels,
                                                scores[..., sl], self.train_cfg)
            elif isinstance(self.bbox_assigner, HeuristicAssigner3D):
                res = self.bbox_assigner.assign(boxes[sl], gt_boxes, None, gt_labels,
                                                query_labels)
            else:
                raise TypeError(f'TransFusionHead supports HungarianAssigner3D and '
                                f'HeuristicAssigner3D, not '
                                f'{type(self.bbox_assigner).__name__}.')
            results.append(res)
        return AssignResult(
            num_gts=sum(r.num_gts for r in results),
            gt_inds=torch.cat([r.gt_inds for r in results]),
            max_overlaps=torch.cat([r.max_overlaps for r in results]),
            labels=torch.cat([r.labels for r in results]))

    def get_targets_single(self, gt_instances_3d: InstanceData, preds: Dict[str, Tensor],
                           query_labels: Tensor) -> Tuple:
        """Targets for one sample; ``preds`` values are ``[1, ., L*P]``."""
        gt_bboxes_3d = gt_instances_3d.bboxes_3d
        gt_labels = gt_instances_3d.labels_3d
        score = preds['heatmap'].detach()
        num_proposals = score.shape[-1]
        boxes = self.bbox_coder.decode(
            score, preds['rot'].detach(), preds['dim'].detach(),
            preds['center'].detach(), preds['height'].detach(),
            preds['vel'].detach() if 'vel' in preds else None)[0]['bboxes']
        gt_boxes = gt_bboxes_3d.tensor.to(boxes)
        gt_labels = gt_labels.to(boxes.device)

        assign = self._assign(boxes, score, gt_boxes, gt_labels, query_labels)
        sampling = self.bbox_sampler.sample(assign, InstanceData(priors=boxes),
                                            InstanceData(bboxes=gt_boxes))
        pos_inds, neg_inds = sampling.pos_inds, sampling.neg_inds

        code_size = self.bbox_coder.code_size
        bbox_targets = boxes.new_zeros(num_proposals, code_size)
        bbox_weights = boxes.new_zeros(num_proposals, code_size)
        ious = assign.max_overlaps.clamp(min=0.0, max=1.0)
        labels = boxes.new_full((num_proposals, ), self.num_classes, dtype=torch.long)
        label_weights = boxes.new_zeros(num_proposals)
        if len(pos_inds) > 0:
            bbox_targets[pos_inds] = self.bbox_coder.encode(sampling.pos_gt_bboxes)
            bbox_weights[pos_inds] = 1.0
            labels[pos_inds] = gt_labels[sampling.pos_assigned_gt_inds]
            pos_weight = self.train_cfg['pos_weight']
            label_weights[pos_inds] = 1.0 if pos_weight <= 0 else pos_weight
        if len(neg_inds) > 0:
            label_weights[neg_inds] = 1.0

        heatmap = self._heatmap_target(gt_bboxes_3d, gt_labels, boxes.device)
        mean_iou = ious[pos_inds].sum() / max(len(pos_inds), 1)
        return (labels[None], label_weights[None], bbox_targets[None], bbox_weights[None],
                ious[None], int(pos_inds.shape[0]), float(mean_iou), heatmap[None])

    def _heatmap_target(self, gt_bboxes_3d, gt_labels: Tensor, device) -> Tensor:
        """Gaussian heatmap ``[K, X, Y]`` of the gt centres on the BEV map.

        Computed on the host in one pass (see :mod:`.heatmap_targets`): the same map,
        bit for bit, as upstream's per-box loop on ``device``.
        """
        boxes = torch.cat([gt_bboxes_3d.gravity_center, gt_bboxes_3d.tensor[:, 3:]], dim=1)
        # one copy to the host: the labels (small integers, exact as floats) ride along
        packed = torch.cat([boxes, gt_labels[:, None].to(boxes)], dim=1).cpu()
        heatmap = self.draw_heatmap_target(packed, torch.device(device).type == 'cuda')
        return torch.from_numpy(heatmap).to(device)

    def draw_heatmap_target(self, packed: Tensor, cuda: bool) -> np.ndarray:
        """``[K, X, Y]`` host heatmap of ``[G, D + 1]`` host boxes (gravity centre,
        sizes, ..., then the label); ``cuda``: round as the CUDA loop would."""
        labels, centres, radii, _, shape = self._heatmap_geometry(packed, cuda)
        return draw_heatmap_array(labels, centres, radii, *shape)

    def heatmap_target_cells(self, packed: Tensor, cuda: bool,
                             maps: Optional[Tensor] = None) -> Tuple[np.ndarray, np.ndarray]:
        """:meth:`draw_heatmap_target`'s set cells: flat indices into ``[K, X, Y]`` and
        their values (:func:`.heatmap_targets.heatmap_cells`); ``maps``: ``[G]`` sample
        of each box, for the cells of a batch's ``[B, K, X, Y]`` maps at once."""
        labels, centres, radii, keep, shape = self._heatmap_geometry(packed, cuda)
        return heatmap_cells(labels, centres, radii, *shape,
                             maps=None if maps is None else maps[keep])

    def heatmap_shape(self) -> Tuple[int, int, int]:
        """``(K, X, Y)`` of the heatmap target."""
        cfg = self.train_cfg
        osf = cfg['out_size_factor']
        return (self.num_classes, int(cfg['grid_size'][0]) // osf,
                int(cfg['grid_size'][1]) // osf)

    def _heatmap_geometry(self, packed: Tensor, cuda: bool) -> tuple:
        """Labels, centres and radii of the drawable boxes, which boxes those are
        (``keep``), and ``(K, X, Y)``."""
        cfg = self.train_cfg
        boxes, labels = packed[:, :-1], packed[:, -1].long()
        keep, centres, radii = box_centres_and_radii(
            boxes, cfg['voxel_size'], cfg['point_cloud_range'], cfg['out_size_factor'],
            cfg['gaussian_overlap'], cfg['min_radius'], cuda=cuda)
        return labels[keep], centres, radii, keep, self.heatmap_shape()

    def start_heatmap_targets(self, batch_data_samples) -> Optional[HeatmapJob]:
        """Start drawing the batch's heatmap targets on the host, to overlap the forward
        that follows (:class:`.hungarian_targets.HeatmapJob`); pass the result to
        :meth:`loss` or :meth:`loss_of_forward`. None where the targets go sample by
        sample (an assigner other than Hungarian) or the head has no train_cfg."""
        if self.train_cfg is None or not self._targets_in_batch():
            return None
        return HeatmapJob(self, [s.gt_instances_3d for s in batch_data_samples],
                          host_ground_truth(batch_data_samples),
                          on_thread=self.heatmaps_on_thread)

    def loss(self, batch_feats, batch_data_samples,
             heatmaps: Optional[HeatmapJob] = None) -> Dict[str, Tensor]:
        metas = [s.metainfo for s in batch_data_samples]
        return self.loss_of_forward(lambda: self(batch_feats, metas), batch_data_samples,
                                    heatmaps)

    def loss_of_forward(self, forward: Callable[[], Tuple[List[dict]]],
                        batch_data_samples,
                        heatmaps: Optional[HeatmapJob] = None) -> Dict[str, Tensor]:
        """:meth:`loss` of the predictions ``forward()`` returns (this head's
        :meth:`forward` on its features, or a CUDA graph of it); ``heatmaps``: from
        :meth:`start_heatmap_targets` (default: started here, before the forward)."""
        if heatmaps is None:
            heatmaps = self.start_heatmap_targets(batch_data_samples)
        gts = [s.gt_instances_3d for s in batch_data_samples]
        return self.loss_by_feat(forward(), gts, heatmaps=heatmaps)

    def loss_by_feat(self, preds_dicts, batch_gt_instances_3d: List[InstanceData],
                     *args, heatmaps: Optional[HeatmapJob] = None,
                     **kwargs) -> Dict[str, Tensor]:
        """Heatmap focal loss, and per supervised layer class + box losses.

        Returns:
            dict: loss_heatmap, layer_{i}_loss_cls / layer_{i}_loss_bbox (the last
            layer is ``layer_-1``), matched_ious (not a loss, for logging).
        """
        if self.train_cfg is None:
            raise ValueError('TransFusionHead.loss needs train_cfg.')
        preds = preds_dicts[0][0]
        (labels, label_weights, bbox_targets, bbox_weights, _, num_pos, matched_ious,
         heatmap, peaks) = self.get_targets(batch_gt_instances_3d, preds, heatmaps)

        losses = dict()
        losses['loss_heatmap'] = self.loss_heatmap(
            clip_sigmoid(preds['dense_heatmap']).float(), heatmap.float(),
            avg_factor=max(peaks, 1))

        key = (bbox_weights.device, bbox_weights.dtype)
        if key not in self._code_weights:  # once: a new tensor from a list waits
            self._code_weights[key] = bbox_weights.new_tensor(self.train_cfg['code_weights'])
        code_weights = self._code_weights[key]
        reg_keys = ['center', 'height', 'dim', 'rot'] + (['vel'] if 'vel' in preds else [])
        num_layers = self._num_layers_supervised
        for layer in range(num_layers):
            prefix = 'layer_-1' if layer == num_layers - 1 else f'layer_{layer}'
            sl = slice(layer * self.num_proposals, (layer + 1) * self.num_proposals)
            cls_score = preds['heatmap'][..., sl].permute(0, 2, 1).reshape(
                -1, self.num_classes)
            losses[f'{prefix}_loss_cls'] = self._cls_loss(
                cls_score.float(), labels[:, sl].reshape(-1),
                label_weights[:, sl].reshape(-1), max(num_pos, 1))
            box_preds = torch.cat([preds[k][..., sl] for k in reg_keys], dim=1)
            losses[f'{prefix}_loss_bbox'] = self._box_loss(
                box_preds.permute(0, 2, 1), bbox_targets[:, sl],
                bbox_weights[:, sl] * code_weights, max(num_pos, 1))
        losses['matched_ious'] = matched_ious.detach().to(heatmap.dtype)
        return losses

    def _cls_loss(self, score: Tensor, labels: Tensor, weight: Tensor,
                  avg_factor: int) -> Tensor:
        """``self.loss_cls``; mmdet's sigmoid ``FocalLoss`` is given one-hot targets, so it
        computes in torch (the path it takes on a CPU) instead of mmcv's CUDA op, whose
        launchers read ``target.max()`` back for an assert in the forward and again in
        the backward: two waits for the GPU a decoder layer. Labels equal to
        ``num_classes`` (background) are rows of zeros, as in mmdet's CPU path; on CUDA
        the loss and gradient equal mmcv's within float rounding (tested)."""
        loss = self.loss_cls
        if type(loss) is FocalLoss and loss.use_sigmoid and not loss.activated:
            labels = F.one_hot(labels, self.num_classes + 1)[:, :self.num_classes]
        return loss(score, labels, weight, avg_factor=avg_factor)

    def _box_loss(self, pred: Tensor, target: Tensor, weight: Tensor,
                  avg_factor: int) -> Tensor:
        """``self.loss_bbox``; for mmdet's ``L1Loss`` its own computation without the
        ``torch.any(weight > 0)`` test before it, a host read that waits for the GPU.
        Where every weight is 0 (no positive proposal) both give a loss of 0."""
        loss = self.loss_bbox
        if type(loss) is L1Loss:
            return loss.loss_weight * l1_loss(pred, target, weight, reduction=loss.reduction,
                                              avg_factor=avg_factor)
        return loss(pred, target, weight, avg_factor=avg_factor)


__all__ = ['TransFusionHead', 'clip_sigmoid']
