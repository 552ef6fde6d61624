"""The LiDAR-camera BEVFusion detector on the CPU: a reduced model with the official
structure (Swin, GeneralizedLSSFPN, DepthLSSTransform, ConvFuser on top of the reduced
LiDAR model of ``common.py``), two cameras; train and predict steps, and the memory
options (checkpointing, lean and deterministic pooling) leave the losses unchanged."""
import copy
import math

import numpy as np
import pytest
import torch
from mmengine.optim import OptimWrapper

from .common import PCR, build, tiny_model_cfg, toy_batch

pytest.importorskip('spconv.pytorch')
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


@pytest.mark.slow
def test_train_step_updates_camera_and_lidar_parameters():
    torch.manual_seed(0)
    model = build(camera_cfg()).train()
    optim = OptimWrapper(torch.optim.AdamW(model.parameters(), lr=1e-3))
    before = {n: p.detach().clone() for n, p in model.named_parameters()
              if p.requires_grad}
    log_vars = model.train_step(camera_batch(), optim)
    assert torch.isfinite(log_vars['loss']) and log_vars['loss'] > 0
    params = dict(model.named_parameters())
    unchanged = [n for n, p in before.items() if torch.equal(params[n], p)]
    assert not unchanged, unchanged
    assert any(n.startswith('view_transform.depthnet') for n in before)
    assert any(n.startswith('img_backbone.') for n in before)


def test_predict_step_with_cameras():
    model = build(camera_cfg()).eval()
    with torch.no_grad():
        results = model.test_step(camera_batch(seed=1))
    assert len(results) == 2
    for res in results:
        assert res.pred_instances_3d.bboxes_3d.tensor.shape[-1] == 9


def losses_of(cfg: dict, state: dict, batch: dict) -> dict:
    model = build(cfg).train()
    model.load_state_dict(state)
    data = model.data_preprocessor(copy.deepcopy(batch), True)
    torch.manual_seed(123)  # same dropout masks in the head
    losses = model(**data, mode='loss')
    return {k: float(v) for k, v in losses.items() if 'loss' in k}


@pytest.mark.slow
def test_memory_options_leave_losses_unchanged():
    torch.manual_seed(0)
    plain_cfg = camera_cfg()
    state = build(plain_cfg).state_dict()
    saver_cfg = camera_cfg(with_cp=True, memory_efficient=True, deterministic=True)
    saver_cfg['img_backbone']['with_cp'] = True
    saver_cfg['img_neck']['with_cp'] = True
    batch = camera_batch(seed=2)
    plain = losses_of(plain_cfg, state, batch)
    saver = losses_of(saver_cfg, state, batch)
    assert plain.keys() == saver.keys()
    for key in plain:
        assert saver[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-5), key
