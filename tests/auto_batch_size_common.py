"""A real mmdet3d setting for the auto batch size tests: the demo PointPillars config
(shrunk for CPUs) on a few frames of synthetic KITTI-format data."""
import os
import os.path as osp
from typing import Any, Tuple

from mmengine.config import Config

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEMO_CONFIG = osp.join(REPO, 'configs', 'demo', 'pointpillars_synthetic_kitti_cpu.py')
DEMO_ROOT = 'data/synthetic_kitti/'


def write_dataset(root: str, train_frames: int = 8) -> str:
    """Synthetic KITTI-format data under ``root`` (written once; returns ``root``)."""
    from mmdet3d_scaling.datasets.synthetic.kitti import write_kitti
    if not osp.isfile(osp.join(root, 'kitti_infos_train.pkl')):
        write_kitti(root, train_frames=train_frames, val_frames=1, seed=0, progress=False)
    return root


def _retarget(node: Any, data_root: str) -> Any:
    if isinstance(node, str) and node.startswith(DEMO_ROOT):
        return osp.join(data_root, node[len(DEMO_ROOT):])
    if isinstance(node, dict):
        return type(node)({k: _retarget(v, data_root) for k, v in node.items()})
    if isinstance(node, (list, tuple)):
        return type(node)(_retarget(v, data_root) for v in node)
    return node


def demo_config(data_root: str, work_dir: str, batch_size: int = 8,
                max_iters: int = 2) -> Config:
    """The demo config on ``data_root``: no validation, no workers, short schedule."""
    cfg = Config.fromfile(DEMO_CONFIG)
    cfg = Config(_retarget(cfg.to_dict(), data_root.rstrip('/') + '/'))
    cfg.work_dir = work_dir
    cfg.launcher = 'none'
    cfg.train_dataloader.batch_size = batch_size
    cfg.train_dataloader.num_workers = 0
    cfg.train_dataloader.pop('persistent_workers', None)
    for key in ('val_dataloader', 'val_cfg', 'val_evaluator', 'test_dataloader',
                'test_cfg', 'test_evaluator'):
        cfg[key] = None
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters)
    lr = cfg.optim_wrapper.optimizer.lr
    cfg.param_scheduler = [dict(type='LinearLR', start_factor=0.5, by_epoch=False,
                                begin=0, end=max_iters)]
    cfg.optim_wrapper.optimizer.lr = lr
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', by_epoch=False,
                                        interval=max_iters)
    cfg.default_hooks.pop('visualization', None)
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=1)
    cfg.log_level = 'WARNING'
    cfg.pop('auto_scale_lr', None)
    _shrink(cfg)
    return cfg


def _shrink(cfg: Config) -> None:
    """Smaller and cheaper than the demo, same kind: a 64 x 64 pillar grid, a third of
    the channels, detection at stride 2; no ObjectSample (its first call compiles
    numba kernels for half a minute in every process)."""
    voxel_size = [0.64, 0.64, 4]
    model = cfg.model
    model.data_preprocessor.voxel_layer.voxel_size = voxel_size
    model.data_preprocessor.voxel_layer.max_voxels = (4000, 4000)
    model.voxel_encoder.update(feat_channels=[16], voxel_size=voxel_size)
    model.middle_encoder.update(in_channels=16, output_shape=[64, 64])
    model.backbone.update(in_channels=16, layer_nums=[1, 1, 1], layer_strides=[2, 2, 2],
                          out_channels=[16, 32, 64])
    model.neck.update(in_channels=[16, 32, 64], upsample_strides=[1, 2, 4],
                      out_channels=[32, 32, 32])
    model.bbox_head.update(in_channels=96, feat_channels=96)
    dataset = cfg.train_dataloader.dataset
    inner = dataset.get('dataset', dataset)
    inner.pipeline = [t for t in inner.pipeline if t['type'] != 'ObjectSample']


def build_parts(cfg: Config) -> Tuple[Any, Any, Any]:
    """Model, optim wrapper and train dataset built from ``cfg`` as the Runner would."""
    import mmdet3d_scaling  # noqa: F401  (registers the plugin, applies patches)
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import init_default_scope

    from mmdet3d.registry import DATASETS, MODELS
    init_default_scope('mmdet3d')
    model = MODELS.build(cfg.model)
    model.init_weights()
    optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    dataset = DATASETS.build(cfg.train_dataloader.dataset)
    return model, optim_wrapper, dataset


def data_root_for_tests(base: str) -> str:
    os.makedirs(base, exist_ok=True)
    return write_dataset(osp.join(base, 'synthetic_kitti'))


def write_demo_config(base: str) -> str:
    """Synthetic data under ``base/data`` and the demo config on it, dumped to
    ``base/demo.py`` (work dir ``base/work``) for tools that take a config path."""
    data_root = data_root_for_tests(osp.join(base, 'data'))
    config = osp.join(base, 'demo.py')
    demo_config(data_root, osp.join(base, 'work')).dump(config)
    return config
