"""BEVFusion's data preprocessor: decoded batches (``decode='cpu'``) take
Det3DDataPreprocessor's code bit for bit; deferred batches (``decode='gpu'``) are
decoded and augmented on the module's device (the CPU here) to the same images; a real
Runner trains the CPU smoke config with ``decode='gpu'``; CUDA-only checks skip here."""
import copy
import os.path as osp

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.dataset import pseudo_collate

from mmdet3d.registry import MODELS
from mmdet3d_scaling.models.bevfusion import BEVFusionDataPreprocessor
from mmdet3d_scaling.models.bevfusion.data_preprocessor import torchvision_decode_jpeg
from mmdet3d_scaling.models.bevfusion.host_ground_truth import HOST_GT_KEY, host_ground_truth
from .common import REPO, build, tiny_model_cfg

CAMS = ('CAM_FRONT', 'CAM_FRONT_RIGHT', 'CAM_FRONT_LEFT', 'CAM_BACK', 'CAM_BACK_LEFT',
        'CAM_BACK_RIGHT')
DATA_PREFIX = dict(pts='samples/LIDAR_TOP', sweeps='sweeps/LIDAR_TOP',
                   **{cam: f'samples/{cam}' for cam in CAMS})
SMOKE_CONFIG = osp.join(REPO, 'configs', 'bevfusion',
                        'bevfusion_lidar-cam_synthetic_nus_cpu.py')
NORM = dict(mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375], bgr_to_rgb=False,
            pad_size_divisor=32)
LEVEL = 1 / 57.12  # one level of 0-255 after normalisation (smallest std)


def _has_torchvision_decoder() -> bool:
    try:
        torchvision_decode_jpeg()
    except ImportError:
        return False
    return True


@pytest.fixture(scope='module')
def data_root(tmp_path_factory):
    """Six frames at the generator's default 256 x 704 cameras (real JPEG files)."""
    from mmdet3d_scaling.datasets.synthetic.nuscenes import (NuScenesSyntheticConfig,
                                                             generate_nuscenes)
    out = str(tmp_path_factory.mktemp('nus_jpeg'))
    generate_nuscenes(NuScenesSyntheticConfig(
        out_dir=out, train_frames=6, val_frames=2, samples_per_scene=2, sweeps=1,
        objects_per_sample=12), progress=False)
    return out + '/'


def _batch(root: str, decode: str, seed: int = 0) -> dict:
    """Two samples through the smoke config's train pipeline, collated as a Runner."""
    from mmdet3d.datasets import NuScenesDataset
    from mmengine.registry import init_default_scope
    init_default_scope('mmdet3d')
    pipeline = copy.deepcopy(Config.fromfile(SMOKE_CONFIG).train_pipeline)
    pipeline[0]['decode'] = decode
    for step in pipeline:
        if step['type'] == 'GridMask':
            step.update(prob=1.0, offset=True)  # also check the recorded masks
    dataset = NuScenesDataset(data_root=root, ann_file='nuscenes_infos_train.pkl',
                              data_prefix=DATA_PREFIX, pipeline=pipeline,
                              modality=dict(use_lidar=True, use_camera=True),
                              metainfo=dict(classes=Config.fromfile(
                                  SMOKE_CONFIG).class_names))
    np.random.seed(seed)
    return pseudo_collate([dataset[0], dataset[1]])


def test_bevfusion_builds_its_preprocessor_from_the_stock_name():
    cfg = tiny_model_cfg()
    model = build(cfg)
    assert type(model.data_preprocessor) is BEVFusionDataPreprocessor
    assert cfg['data_preprocessor']['type'] == 'Det3DDataPreprocessor'  # not modified


def test_decoded_batches_are_det3d_preprocessor_bit_for_bit(data_root):
    batch = _batch(data_root, 'cpu')
    stock = MODELS.build(dict(type='Det3DDataPreprocessor', **NORM))
    ours = MODELS.build(dict(type='BEVFusionDataPreprocessor', **NORM))
    assert type(stock) is not type(ours)
    a, b = stock(copy.deepcopy(batch), True), ours(copy.deepcopy(batch), True)
    assert torch.equal(a['inputs']['imgs'], b['inputs']['imgs'])
    assert all(torch.equal(p, q) for p, q in zip(a['inputs']['points'],
                                                 b['inputs']['points']))
    for s, t in zip(a['data_samples'], b['data_samples']):
        assert t.metainfo.keys() - s.metainfo.keys() == {HOST_GT_KEY}
        assert s.batch_input_shape == t.batch_input_shape and s.pad_shape == t.pad_shape


def test_training_batches_keep_the_loaders_ground_truth_on_the_host(data_root):
    """In training the samples carry the loader's ground truth, on the host, equal to
    the one the model gets (:mod:`...bevfusion.host_ground_truth`); not in testing."""
    batch = _batch(data_root, 'cpu')
    ours = MODELS.build(dict(type='BEVFusionDataPreprocessor', **NORM))
    samples = ours(copy.deepcopy(batch), True)['data_samples']
    found = host_ground_truth(samples)
    assert found is not None and sum(len(g) for g in found) > 0
    for sample, host in zip(samples, found):
        gt = sample.gt_instances_3d
        assert not host.bboxes_3d.tensor.is_cuda
        assert torch.equal(host.bboxes_3d.tensor, gt.bboxes_3d.tensor.cpu())
        assert torch.equal(host.labels_3d, gt.labels_3d.cpu())
    tested = ours(copy.deepcopy(batch), False)['data_samples']
    assert host_ground_truth(tested) is None


def test_deferred_batch_gives_the_pil_path_images(data_root):
    ref = MODELS.build(dict(type='Det3DDataPreprocessor', **NORM))(
        _batch(data_root, 'cpu', seed=4), True)
    deferred = _batch(data_root, 'gpu', seed=4)
    assert all(img.dtype == torch.uint8 and img.dim() == 3
               for img in deferred['inputs']['img'])
    got = MODELS.build(dict(type='BEVFusionDataPreprocessor', **NORM))(deferred, True)
    a, b = ref['inputs']['imgs'], got['inputs']['imgs']
    assert a.shape == b.shape == (2, 6, 3, 64, 192)
    diff = (a - b).abs()
    assert diff.max() <= 2 * LEVEL + 1e-5 and (diff > 1e-5).float().mean() < 0.005
    for s, t in zip(ref['data_samples'], got['data_samples']):
        assert np.array_equal(np.stack(s.img_aug_matrix), np.stack(t.img_aug_matrix))
        assert s.batch_input_shape == t.batch_input_shape and s.pad_shape == t.pad_shape


def test_mixed_batch_and_bad_decoder_are_refused(data_root):
    with pytest.raises(ValueError, match="jpeg_decoder='nvjpeg'"):
        MODELS.build(dict(type='BEVFusionDataPreprocessor', jpeg_decoder='nvjpeg'))
    cpu, gpu = _batch(data_root, 'cpu'), _batch(data_root, 'gpu')
    mixed = dict(inputs=dict(points=cpu['inputs']['points'],
                             img=[cpu['inputs']['img'][0], gpu['inputs']['img'][1]]),
                 data_samples=cpu['data_samples'])
    with pytest.raises(ValueError, match='mixes deferred'):
        MODELS.build(dict(type='BEVFusionDataPreprocessor', **NORM))(mixed, True)


@pytest.mark.skipif(_has_torchvision_decoder(), reason='torchvision decodes here')
def test_torchvision_decoder_missing_says_what_to_do(data_root):
    pre = MODELS.build(dict(type='BEVFusionDataPreprocessor', jpeg_decoder='torchvision',
                            **NORM))
    with pytest.raises(ImportError, match=r"torchvision.*decode='cpu'"):
        pre(_batch(data_root, 'gpu'), True)


@pytest.mark.slow
def test_runner_trains_with_gpu_decode(data_root, tmp_path):
    """The CPU smoke config with decode='gpu' in both pipelines: a real Runner trains
    two iterations and validates; the model's preprocessor decoded the images on the
    Runner's device (the CPU here, CUDA where there is one)."""
    pytest.importorskip('spconv.pytorch')
    from mmengine.runner import Runner
    cfg = Config.fromfile(SMOKE_CONFIG)
    cfg.work_dir = str(tmp_path / 'work')
    for loader in (cfg.train_dataloader, cfg.val_dataloader):
        dataset = loader.dataset.get('dataset', loader.dataset)
        dataset.data_root = data_root
        assert dataset.pipeline[0].type == 'BEVLoadMultiViewImageFromFiles'
        dataset.pipeline[0].decode = 'gpu'
        loader.num_workers = 0
        loader.persistent_workers = False
    cfg.test_dataloader = cfg.val_dataloader
    cfg.val_evaluator.data_root = data_root
    cfg.val_evaluator.ann_file = data_root + 'nuscenes_infos_val.pkl'
    cfg.test_evaluator = cfg.val_evaluator
    cfg.train_cfg.max_iters = 2
    cfg.train_cfg.val_interval = 10 ** 6
    cfg.param_scheduler = []
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', interval=-1)
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=1)
    runner = Runner.from_cfg(cfg)
    runner.train()
    pre = runner.model.data_preprocessor
    assert type(pre) is BEVFusionDataPreprocessor and pre._announced
    losses = runner.message_hub.get_scalar('train/loss').data[0]
    assert len(losses) == 2 and np.isfinite(losses).all()
    metrics = runner.val_loop.run()
    assert 'NuScenes metric/pred_instances_3d_NuScenes/mAP' in metrics


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA (nvJPEG)')
def test_nvjpeg_images_close_to_pil_path(data_root):
    """nvJPEG's pixels differ from libjpeg's by IDCT / chroma upsampling rounding;
    the geometry is the same code as on the CPU. Bound: mean below 0.5 level."""
    if not _has_torchvision_decoder():
        pytest.skip('torchvision.io.decode_jpeg with device decoding is missing')
    ref = _batch(data_root, 'cpu', seed=2)
    deferred = _batch(data_root, 'gpu', seed=2)
    pre = MODELS.build(dict(type='BEVFusionDataPreprocessor', **NORM)).cuda()
    assert pre._backend() == 'torchvision'
    got = pre.decode_deferred(deferred['inputs']['img'])
    for img_ref, img in zip(ref['inputs']['img'], got):
        assert img.is_cuda and img.shape == img_ref.shape
        diff = (img.cpu() - img_ref).abs()
        assert diff.mean() < 0.5, float(diff.mean())
