"""LiDAR-camera configs: the same effective recipe on 1, 2, 4 and 8 GPUs and on one
24 GB GPU (configs/bevfusion_1gpu.py), and the official state-dict layout.

The official-size model is built on the CPU (no weights are downloaded: only
``init_weights`` would fetch the Swin-T checkpoint) and its state-dict names and shapes
are compared with mmdet3d's (582 entries, 40,843,052 numbers).
"""
import json
import math
import os.path as osp

import pytest
from mmengine.config import Config
from mmengine.registry import init_default_scope

import mmdet3d_scaling  # noqa: F401  (registers the models)
from mmdet3d.registry import MODELS
from mmdet3d_scaling.config.scaling_recipe import apply_scaling_recipe

REPO = osp.dirname(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
CFG_DIR = osp.join(REPO, 'configs', 'bevfusion')
BASE = osp.join(CFG_DIR, 'bevfusion_lidar-cam_voxel0075_second_secfpn_nus-3d.py')
ONE_GPU = osp.join(REPO, 'configs', 'bevfusion_1gpu.py')
SYNTHETIC = osp.join(CFG_DIR, 'bevfusion_lidar-cam_synthetic_nus_cpu.py')
REFERENCE_JSON = osp.join(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))),
                          'data', 'reference', 'official_bevfusion_state_dict.json')
LIDAR_CAM = 'bevfusion_lidar-cam_voxel0075_second_secfpn_8xb4-cyclic-20e_nus-3d'


def variant(gpus: int) -> str:
    return osp.join(CFG_DIR,
                    f'bevfusion_lidar-cam_voxel0075_second_secfpn_{gpus}xb4-6e_nus-3d.py')


def prepared(path: str, world_size: int) -> Config:
    from mmdet3d_scaling.config.legacy_keys import translate_amp_config
    cfg = Config.fromfile(path)
    translate_amp_config(cfg)  # amp = dict(dtype='auto') -> AmpOptimWrapper settings
    return apply_scaling_recipe(cfg, world_size)


def assert_official_recipe(cfg: Config) -> None:
    plan = cfg.scaling_plan['plan']
    assert plan['total_batch'] == 32 and plan['lr_scale'] == 1.0
    assert cfg.optim_wrapper.optimizer.type == 'AdamW'
    assert cfg.optim_wrapper.optimizer.lr == pytest.approx(2e-4)
    assert cfg.optim_wrapper.optimizer.weight_decay == 0.01
    assert cfg.optim_wrapper.clip_grad == dict(max_norm=35, norm_type=2)
    assert cfg.train_cfg.max_epochs == 6 and cfg.train_cfg.val_interval == 1
    warmup, cosine = cfg.param_scheduler[:2]
    assert warmup.type == 'LinearLR' and warmup.start_factor == pytest.approx(1 / 3)
    # 500 optimizer steps of warm-up, counted in micro-batches by the loop
    assert warmup.end == 500 * plan['accumulation']
    assert cosine.type == 'CosineAnnealingLR' and cosine.T_max == 6
    assert cosine.eta_min_ratio == 1e-4
    assert cfg.val_evaluator.type == 'NuScenesMetric'
    assert cfg.train_dataloader.dataset.type == 'CBGSDataset'
    inner = cfg.train_dataloader.dataset.dataset
    assert inner.modality == dict(use_lidar=True, use_camera=True)
    types = [t['type'] for t in inner.pipeline]
    assert types[0] == 'BEVLoadMultiViewImageFromFiles' and 'ObjectSample' not in types
    assert {'ImageAug3D', 'BEVFusionGlobalRotScaleTrans', 'BEVFusionRandomFlip3D',
            'GridMask'} <= set(types)
    assert cfg.model.view_transform.type == 'DepthLSSTransform'
    assert cfg.model.fusion_layer.in_channels == [80, 256]


@pytest.mark.parametrize('gpus', [1, 2, 4, 8])
def test_gpu_count_variants_keep_the_effective_recipe(gpus):
    cfg = prepared(variant(gpus), gpus)
    assert cfg.train_dataloader.batch_size == 4
    assert cfg.scaling_plan['plan']['accumulation'] == 8 // gpus
    assert cfg.optim_wrapper.get('accumulative_counts', 1) == 8 // gpus
    assert_official_recipe(cfg)


def test_one_gpu_config_is_the_official_recipe_with_memory_savers():
    cfg = prepared(ONE_GPU, 1)
    # the plan it starts from; FastestFitHook replaces it by the fastest that fits
    assert cfg.scaling.memory_budget == '24GiB'
    assert cfg.train_dataloader.batch_size == 4
    assert cfg.optim_wrapper.accumulative_counts == 8
    assert cfg.optim_wrapper.type == 'AmpOptimWrapper'
    # amp = dict(dtype='auto'): bf16 where the GPU has it natively, else fp16 from 2**3
    from mmdet3d_scaling.config.legacy_keys import cuda_bf16_supported, resolve_auto_amp
    assert cfg.optim_wrapper.loss_scale == resolve_auto_amp(
        cuda_bf16_supported()[0])['loss_scale']
    assert cfg.model.img_backbone.with_cp and cfg.model.img_neck.with_cp
    assert cfg.model.view_transform.with_cp and cfg.model.view_transform.memory_efficient
    assert_official_recipe(cfg)
    # started on 2 GPUs it re-plans to the same effective batch
    cfg2 = prepared(ONE_GPU, 2)
    assert cfg2.optim_wrapper.accumulative_counts == 4
    assert cfg2.scaling_plan['plan']['total_batch'] == 32


def test_synthetic_config_camera_and_lidar_maps_align():
    cfg = Config.fromfile(SYNTHETIC)
    vt = cfg.model.view_transform
    cells = round((vt.xbound[1] - vt.xbound[0]) / vt.xbound[2]) // vt.downsample
    lidar_cells = cfg.grid_size[0] // cfg.out_size_factor
    assert cells == lidar_cells
    assert vt.image_size == cfg.final_dim
    assert [s * 8 for s in vt.feature_size] == list(vt.image_size)
    assert cfg.model.fusion_layer.in_channels == [vt.out_channels,
                                                  cfg.model.pts_backbone.in_channels]


@pytest.fixture(scope='module')
def reference():
    if not osp.isfile(REFERENCE_JSON):
        pytest.skip(f'{REFERENCE_JSON} not available')
    with open(REFERENCE_JSON) as f:
        return json.load(f)[LIDAR_CAM]


@pytest.mark.parametrize('path', [BASE, ONE_GPU])
def test_official_size_model_state_dict_matches_reference(path, reference):
    pytest.importorskip('spconv.pytorch')
    from mmdet3d_scaling.models.bevfusion import sparse_backend as sb
    init_default_scope('mmdet3d')
    model = MODELS.build(Config.fromfile(path).model)
    sparse = {f'{n}.weight': m for n, m in sb.iter_sparse_convs(model)}
    ours = {}
    for name, value in model.state_dict().items():
        if name in sparse:  # compare in spconv 2's layout, as the reference
            value = sb.to_layout(value, sb.module_layout(sparse[name]), sb.SPCONV)
        ours[name] = list(value.shape)
    assert sorted(set(reference) - set(ours)) == []
    assert sorted(set(ours) - set(reference)) == []
    assert {k: v for k, v in ours.items() if reference[k] != v} == {}
    assert len(ours) == 582
    assert sum(math.prod(s) for s in ours.values()) == 40_843_052
