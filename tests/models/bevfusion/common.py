"""Shared helpers of the BEVFusion tests: a reduced LiDAR-only model, toy frames, and
the LiDAR-camera model on top of it (two cameras, ``camera_cfg`` / ``camera_batch``).

The reduced model keeps the official structure (basic-block sparse encoder with the
official Z layout, SECOND + SECONDFPN, TransFusion head with velocity) on a 25.6 m x
25.6 m grid of 0.2 m voxels (BEV map 16 x 16) with a fraction of the channels, so a
train step takes well under a second on two CPU cores.
"""
import copy
import math
import os.path as osp
from typing import List, Optional, Tuple

import numpy as np
import torch

from mmengine.registry import DefaultScope, init_default_scope

import mmdet3d_scaling  # noqa: F401  (registers the models)
from mmdet3d.registry import MODELS
from mmdet3d.structures import Det3DDataSample, LiDARInstance3DBoxes
from mmengine.structures import InstanceData

REPO = osp.dirname(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
REFERENCE_JSON = osp.join(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))),
                          'data', 'reference', 'official_bevfusion_state_dict.json')
LIDAR_CONFIG_NAME = 'bevfusion_lidar_voxel0075_second_secfpn_8xb4-cyclic-20e_nus-3d'

CLASSES = ['car', 'truck', 'construction_vehicle', 'bus', 'trailer', 'barrier',
           'motorcycle', 'bicycle', 'pedestrian', 'traffic_cone']
PCR = [-12.8, -12.8, -5.0, 12.8, 12.8, 3.0]
VOXEL = [0.2, 0.2, 0.2]
GRID = [128, 128, 41]
OSF = 8

# As in a Runner: unscoped type names (Det3DDataPreprocessor, ...) resolve in mmdet3d.
init_default_scope('mmdet3d')


def tiny_head_cfg(num_decoder_layers: int = 1, num_proposals: int = 20,
                  in_channels: int = 64, grid=GRID, pcr=PCR, voxel=VOXEL,
                  nms_type: Optional[str] = None, assigner: Optional[dict] = None) -> dict:
    """A TransFusionHead config with the official structure, reduced widths."""
    assigner = assigner or dict(
        type='HungarianAssigner3D',
        iou_calculator=dict(type='BboxOverlaps3D', coordinate='lidar'),
        cls_cost=dict(type='mmdet.FocalLossCost', gamma=2.0, alpha=0.25, weight=0.15),
        reg_cost=dict(type='BBoxBEVL1Cost', weight=0.25),
        iou_cost=dict(type='IoU3DCost', weight=0.25))
    return dict(
        type='TransFusionHead',
        num_proposals=num_proposals,
        auxiliary=True,
        in_channels=in_channels,
        hidden_channel=32,
        num_classes=10,
        nms_kernel_size=3,
        bn_momentum=0.1,
        num_decoder_layers=num_decoder_layers,
        decoder_layer=dict(
            type='TransformerDecoderLayer',
            self_attn_cfg=dict(embed_dims=32, num_heads=2, dropout=0.1),
            cross_attn_cfg=dict(embed_dims=32, num_heads=2, dropout=0.1),
            ffn_cfg=dict(embed_dims=32, feedforward_channels=64, num_fcs=2, ffn_drop=0.1,
                         act_cfg=dict(type='ReLU', inplace=True)),
            norm_cfg=dict(type='LN'),
            pos_encoding_cfg=dict(input_channel=2, num_pos_feats=32)),
        train_cfg=dict(
            dataset='nuScenes', point_cloud_range=pcr, grid_size=grid, voxel_size=voxel,
            out_size_factor=OSF, gaussian_overlap=0.1, min_radius=2, pos_weight=-1,
            code_weights=[1.0] * 8 + [0.2, 0.2], assigner=assigner),
        test_cfg=dict(dataset='nuScenes', grid_size=grid, out_size_factor=OSF,
                      voxel_size=voxel[:2], pc_range=pcr[:2], nms_type=nms_type,
                      pre_maxsize=100, post_maxsize=50),
        common_heads=dict(center=[2, 2], height=[1, 2], dim=[3, 2], rot=[2, 2],
                          vel=[2, 2]),
        bbox_coder=dict(type='TransFusionBBoxCoder', pc_range=pcr[:2],
                        post_center_range=[p * 1.2 for p in pcr[:2]] + [-10.0]
                        + [p * 1.2 for p in pcr[3:5]] + [10.0],
                        score_threshold=0.0, out_size_factor=OSF, voxel_size=voxel[:2],
                        code_size=10),
        loss_cls=dict(type='mmdet.FocalLoss', use_sigmoid=True, gamma=2.0, alpha=0.25,
                      reduction='mean', loss_weight=1.0),
        loss_heatmap=dict(type='mmdet.GaussianFocalLoss', reduction='mean',
                          loss_weight=1.0),
        loss_bbox=dict(type='mmdet.L1Loss', reduction='mean', loss_weight=0.25))


def tiny_encoder_cfg(sparse_backend: str = 'auto', grid=GRID) -> dict:
    return dict(
        type='BEVFusionSparseEncoder', in_channels=5, sparse_shape=grid,
        order=('conv', 'norm', 'act'), norm_cfg=dict(type='BN1d', eps=0.001, momentum=0.01),
        base_channels=8, output_channels=32,
        encoder_channels=((8, 8, 16), (16, 16, 32), (32, 32, 64), (64, 64)),
        encoder_paddings=((0, 0, 1), (0, 0, 1), (0, 0, (1, 1, 0)), (0, 0)),
        block_type='basicblock', sparse_backend=sparse_backend)


def tiny_model_cfg(sparse_backend: str = 'auto', **head_kwargs) -> dict:
    """A LiDAR-only BEVFusion config: official structure, reduced grid and widths."""
    return dict(
        type='BEVFusion',
        data_preprocessor=dict(
            type='Det3DDataPreprocessor', pad_size_divisor=32,
            voxelize_cfg=dict(max_num_points=10, point_cloud_range=PCR, voxel_size=VOXEL,
                              max_voxels=[20000, 30000], voxelize_reduce=True)),
        pts_voxel_encoder=dict(type='HardSimpleVFE', num_features=5),
        pts_middle_encoder=tiny_encoder_cfg(sparse_backend),
        pts_backbone=dict(type='SECOND', in_channels=64, out_channels=[32, 64],
                          layer_nums=[1, 1], layer_strides=[1, 2],
                          norm_cfg=dict(type='BN', eps=0.001, momentum=0.01),
                          conv_cfg=dict(type='Conv2d', bias=False)),
        pts_neck=dict(type='SECONDFPN', in_channels=[32, 64], out_channels=[32, 32],
                      upsample_strides=[1, 2],
                      norm_cfg=dict(type='BN', eps=0.001, momentum=0.01),
                      upsample_cfg=dict(type='deconv', bias=False),
                      use_conv_for_no_stride=True),
        bbox_head=tiny_head_cfg(**head_kwargs))


def build(cfg: dict):
    """The model of ``cfg`` in mmdet3d's scope, whatever scope an earlier test left."""
    with DefaultScope.overwrite_default_scope('mmdet3d'):
        return MODELS.build(copy.deepcopy(cfg))


def toy_boxes(rng: np.random.Generator, n: int = 4) -> Tuple[np.ndarray, np.ndarray]:
    """``n`` bottom-centred boxes (x, y, z, l, w, h, yaw, vx, vy) and labels in the
    tiny range, cars and pedestrians, apart from each other."""
    boxes, labels = [], []
    while len(boxes) < n:
        label = int(rng.choice([0, 8]))
        lwh = (4.0, 1.8, 1.6) if label == 0 else (0.7, 0.7, 1.7)
        xy = rng.uniform(-9.0, 9.0, size=2)
        if any(np.hypot(*(xy - b[:2])) < 5.0 for b in boxes):
            continue
        boxes.append(np.array([*xy, -1.8, *lwh, rng.uniform(-np.pi, np.pi),
                               *rng.normal(0, 1, 2)]))
        labels.append(label)
    return np.stack(boxes).astype(np.float32), np.array(labels)


def toy_points(rng: np.random.Generator, boxes: np.ndarray, n_ground: int = 3000,
               per_box: int = 300) -> np.ndarray:
    """5-dim points: a ground plane and points filling each box."""
    # z -1.83: not on a voxel boundary (-1.8 is one: (-1.8 + 5) / 0.2 = 16)
    ground = np.c_[rng.uniform(-12.7, 12.7, (n_ground, 2)), np.full(n_ground, -1.83),
                   rng.uniform(0, 1, n_ground), np.zeros(n_ground)]
    parts = [ground]
    for box in boxes:
        local = rng.uniform(-0.5, 0.5, (per_box, 3)) * box[3:6]
        c, s = np.cos(box[6]), np.sin(box[6])
        xy = local[:, :2] @ np.array([[c, s], [-s, c]])
        pts = np.c_[xy + box[:2], local[:, 2] + box[2] + box[5] / 2,
                    np.full(per_box, 0.8), np.zeros(per_box)]
        parts.append(pts)
    return np.concatenate(parts).astype(np.float32)


def toy_batch(seed: int = 0, batch_size: int = 2, n_boxes: int = 4,
              empty: Tuple[int, ...] = ()) -> dict:
    """A collated batch ``dict(inputs=dict(points=[...]), data_samples=[...])``; samples
    listed in ``empty`` have no ground-truth boxes."""
    rng = np.random.default_rng(seed)
    points, samples = [], []
    for i in range(batch_size):
        boxes, labels = toy_boxes(rng, n_boxes)
        if i in empty:
            boxes, labels = boxes[:0], labels[:0]
        points.append(torch.from_numpy(toy_points(rng, boxes)))
        sample = Det3DDataSample(metainfo=dict(box_type_3d=LiDARInstance3DBoxes,
                                               sample_idx=i))
        gt = InstanceData()
        gt.bboxes_3d = LiDARInstance3DBoxes(torch.from_numpy(boxes), box_dim=9)
        gt.labels_3d = torch.from_numpy(labels).long()
        sample.gt_instances_3d = gt
        samples.append(sample)
    return dict(inputs=dict(points=points), data_samples=samples)


def gt_of(batch: dict) -> List[InstanceData]:
    return [s.gt_instances_3d for s in batch['data_samples']]


# The LiDAR-camera model: the reduced LiDAR model above with a reduced camera branch
# of the official structure and two cameras.
IMAGE = (32, 96)  # multiples of 32 (the preprocessor pads to 32)
CAMS = 2


def camera_cfg(**view_options) -> dict:
    cfg = tiny_model_cfg()
    cfg['data_preprocessor'].update(mean=[123.675, 116.28, 103.53],
                                    std=[58.395, 57.12, 57.375], bgr_to_rgb=False)
    cfg.update(
        img_backbone=dict(
            type='mmdet.SwinTransformer', embed_dims=16, depths=[1, 1, 1, 1],
            num_heads=[1, 1, 2, 4], window_size=7, mlp_ratio=2, qkv_bias=True,
            drop_rate=0.0, attn_drop_rate=0.0, drop_path_rate=0.0, patch_norm=True,
            out_indices=[1, 2, 3], with_cp=False, convert_weights=False),
        img_neck=dict(
            type='GeneralizedLSSFPN', in_channels=[32, 64, 128], out_channels=16,
            start_level=0, num_outs=3, norm_cfg=dict(type='BN2d', requires_grad=True),
            act_cfg=dict(type='ReLU', inplace=True),
            upsample_cfg=dict(mode='bilinear', align_corners=False)),
        view_transform=dict(
            type='DepthLSSTransform', in_channels=16, out_channels=8, image_size=IMAGE,
            feature_size=[IMAGE[0] // 8, IMAGE[1] // 8], xbound=[PCR[0], PCR[3], 0.8],
            ybound=[PCR[1], PCR[4], 0.8], zbound=[-10.0, 10.0, 20.0],
            dbound=[1.0, 19.0, 2.0], downsample=2, **view_options),
        fusion_layer=dict(type='ConvFuser', in_channels=[8, 64], out_channels=64))
    return cfg


def camera_metas():
    """Two cameras at 1.5 m height looking forward and backward, focal 48 px."""
    K = np.eye(4)
    K[0, 0] = K[1, 1] = 48.0
    K[0, 2], K[1, 2] = IMAGE[1] / 2, IMAGE[0] / 2
    lidar2img, cam2lidar, cam2img = [], [], []
    for n in range(CAMS):
        yaw = math.pi * n
        c2l = np.eye(4)
        c2l[:3, :3] = np.stack([[math.sin(yaw), -math.cos(yaw), 0.0], [0.0, 0.0, -1.0],
                                [math.cos(yaw), math.sin(yaw), 0.0]], 1)
        c2l[:3, 3] = [0.0, 0.0, -0.3]
        cam2lidar.append(c2l)
        cam2img.append(K)
        lidar2img.append(K @ np.linalg.inv(c2l))
    return dict(lidar2img=np.stack(lidar2img), cam2img=np.stack(cam2img),
                cam2lidar=np.stack(cam2lidar),
                img_aug_matrix=np.stack([np.eye(4, dtype=np.float32)] * CAMS),
                lidar_aug_matrix=np.eye(4))


def camera_batch(seed: int = 0) -> dict:
    batch = toy_batch(seed=seed)
    g = torch.Generator().manual_seed(seed)
    batch['inputs']['img'] = [torch.rand(CAMS, 3, *IMAGE, generator=g) * 255
                              for _ in batch['data_samples']]
    for sample in batch['data_samples']:
        sample.set_metainfo(camera_metas())
    return batch
