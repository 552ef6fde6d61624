"""The BEVFusion detector (LiDAR-only) on the CPU with spconv: train and predict steps,
config errors, and a short real Runner run on synthetic nuScenes-format data."""
import copy
import os.path as osp

import pytest
import torch
from mmengine.registry import DefaultScope
from mmengine.config import Config
from mmengine.optim import OptimWrapper

from mmdet3d.registry import MODELS
from mmdet3d.structures import Det3DDataSample, LiDARInstance3DBoxes

from .common import REPO, build, tiny_model_cfg, toy_batch

pytest.importorskip('spconv.pytorch')
SYNTHETIC_CONFIG = osp.join(REPO, 'configs', 'bevfusion',
                            'bevfusion_lidar_synthetic_nus_cpu.py')


def test_train_step_updates_every_parameter():
    torch.manual_seed(0)
    model = build(tiny_model_cfg())
    model.train()
    optim = OptimWrapper(torch.optim.AdamW(model.parameters(), lr=1e-3))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    log_vars = model.train_step(toy_batch(seed=0), optim)
    assert {'loss', 'loss_heatmap', 'layer_-1_loss_cls', 'layer_-1_loss_bbox',
            'matched_ious'} <= set(log_vars)
    assert torch.isfinite(log_vars['loss']) and log_vars['loss'] > 0
    unchanged = [n for n, p in model.named_parameters() if torch.equal(p, before[n])]
    assert not unchanged, unchanged


def test_loss_goes_down_when_fitting_one_batch():
    torch.manual_seed(0)
    model = build(tiny_model_cfg())
    model.train()
    optim = OptimWrapper(torch.optim.AdamW(model.parameters(), lr=3e-3))
    batch = toy_batch(seed=5)
    losses = [float(model.train_step(batch, optim)['loss']) for _ in range(12)]
    assert min(losses[-3:]) < 0.7 * losses[0], losses


def test_predict_step():
    model = build(tiny_model_cfg()).eval()
    batch = toy_batch(seed=1)
    with torch.no_grad():
        results = model.test_step(batch)
    assert len(results) == 2
    for res in results:
        assert isinstance(res, Det3DDataSample)
        pred = res.pred_instances_3d
        assert isinstance(pred.bboxes_3d, LiDARInstance3DBoxes)
        assert pred.bboxes_3d.tensor.shape[-1] == 9
        assert len(pred.scores_3d) == len(pred.labels_3d) <= 20


def test_batch_of_one_and_empty_frame():
    model = build(tiny_model_cfg())
    model.train()
    data = model.data_preprocessor(toy_batch(batch_size=2, empty=(0, )), True)
    losses = model(**data, mode='loss')
    assert torch.isfinite(sum(v for k, v in losses.items() if 'loss' in k))
    model.eval()
    with torch.no_grad():
        assert len(model.test_step(toy_batch(batch_size=1))) == 1


def test_config_is_not_modified_by_build():
    cfg = tiny_model_cfg()
    snapshot = copy.deepcopy(cfg)
    with DefaultScope.overwrite_default_scope('mmdet3d'):  # whatever an earlier test left
        MODELS.build(cfg)
    assert cfg == snapshot  # voxelize_cfg taken from a copy: the config builds twice


@pytest.mark.parametrize('change, match', [
    (lambda c: c['data_preprocessor'].pop('voxelize_cfg'), 'voxelize_cfg'),
    (lambda c: c['data_preprocessor']['voxelize_cfg'].pop('voxelize_reduce'),
     'voxelize_reduce'),
    (lambda c: c.pop('pts_neck'), 'pts_neck'),
    (lambda c: c.update(img_neck=dict(type='FPN')), 'camera branch'),
    (lambda c: c.update(checkpoint_modules=['pts_backbone']), 'checkpoint_modules'),
    (lambda c: c.update(seg_head=dict(type='x')), 'seg_head'),
])
def test_bad_config(change, match):
    cfg = tiny_model_cfg()
    change(cfg)
    with pytest.raises(ValueError, match=match):
        build(cfg)


def test_points_required():
    model = build(tiny_model_cfg()).eval()
    with pytest.raises(ValueError, match='points'):
        model.extract_feat(dict(points=[]), [])


def test_voxelize_reduce_false_uses_voxel_encoder():
    cfg = tiny_model_cfg()
    cfg['data_preprocessor']['voxelize_cfg']['voxelize_reduce'] = False
    model = build(cfg).eval()
    reduced = build(tiny_model_cfg()).eval()
    reduced.load_state_dict(model.state_dict())
    batch = toy_batch(seed=2)
    with torch.no_grad():
        a = model.extract_pts_feat(batch['inputs'])
        b = reduced.extract_pts_feat(batch['inputs'])
    assert torch.allclose(a, b, atol=1e-5)  # HardSimpleVFE = mean of the points


# ------------------------------------------------------------------ Runner + data


def _synthetic_data(root: str) -> str:
    synthetic = pytest.importorskip('mmdet3d_scaling.datasets.synthetic.nuscenes')
    out = osp.join(root, 'synthetic_nuscenes')
    synthetic.generate_nuscenes(
        synthetic.NuScenesSyntheticConfig(out_dir=out, train_frames=6, val_frames=2,
                                          samples_per_scene=2, sweeps=1,
                                          objects_per_sample=12),
        progress=False)
    return out + '/'


@pytest.mark.slow
def test_runner_trains_and_evaluates_on_synthetic_nuscenes(tmp_path):
    """The CPU smoke config on 6 synthetic frames, 8 iterations: loss goes down,
    NuScenesMetric evaluates the predictions."""
    from mmengine.runner import Runner
    if not osp.isfile(SYNTHETIC_CONFIG):
        pytest.skip('synthetic config missing')
    data_root = _synthetic_data(str(tmp_path))
    cfg = Config.fromfile(SYNTHETIC_CONFIG)
    cfg.work_dir = str(tmp_path / 'work')
    cfg.train_dataloader.dataset.dataset.data_root = data_root
    sampler = cfg.train_dataloader.dataset.dataset.pipeline[3]
    assert sampler.type == 'ObjectSample'
    sampler.db_sampler.data_root = data_root
    sampler.db_sampler.info_path = data_root + 'nuscenes_dbinfos_train.pkl'
    cfg.val_dataloader.dataset.data_root = data_root
    cfg.test_dataloader = cfg.val_dataloader
    for evaluator in (cfg.val_evaluator, ):
        evaluator.data_root = data_root
        evaluator.ann_file = data_root + 'nuscenes_infos_val.pkl'
    cfg.test_evaluator = cfg.val_evaluator
    cfg.train_dataloader.num_workers = 0
    cfg.train_dataloader.persistent_workers = False
    cfg.val_dataloader.num_workers = 0
    cfg.val_dataloader.persistent_workers = False
    cfg.train_cfg.max_iters = 8
    cfg.train_cfg.val_interval = 10 ** 6  # evaluated once below
    cfg.param_scheduler = []
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', interval=-1)
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=2)
    cfg.log_processor = dict(by_epoch=False, window_size=2)

    runner = Runner.from_cfg(cfg)
    runner.train()
    history = runner.message_hub.get_scalar('train/loss').data[0]
    first, last = history[:2].mean(), history[-2:].mean()
    assert last < first, history
    metrics = runner.val_loop.run()
    assert 'NuScenes metric/pred_instances_3d_NuScenes/mAP' in metrics


# ------------------------------------------------------------------ configs


@pytest.mark.parametrize('gpus', [1, 2, 4, 8])
def test_lidar_configs_keep_the_official_effective_batch(gpus):
    """Each per-GPU-count variant (and the generic recipe on that many GPUs) plans
    4 samples per GPU x accumulation = 32 per optimizer step, lr 1e-4 unscaled."""
    from mmdet3d_scaling.config.scaling_recipe import plan_from_config
    base = osp.join(REPO, 'configs', 'bevfusion')
    variant = f'bevfusion_lidar_voxel0075_second_secfpn_{gpus}xb4-cyclic-20e_nus-3d.py'
    for name in (variant, 'bevfusion_lidar_voxel0075_second_secfpn_nus-3d.py'):
        cfg = Config.fromfile(osp.join(base, name))
        assert cfg.custom_imports == dict(imports=['mmdet3d_scaling'],
                                          allow_failed_imports=False)
        plan = plan_from_config(cfg, gpus)
        assert (plan.per_gpu_batch, plan.accumulation, plan.total_batch) == (4, 8 // gpus, 32)
        assert plan.lr_scale == 1.0 and cfg.optim_wrapper.optimizer.lr == 1e-4
        assert cfg.train_cfg.max_epochs == 20
        assert cfg.model.pts_middle_encoder.sparse_shape == [1440, 1440, 41]
