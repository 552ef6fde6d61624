"""Helpers shared by the synthetic-data and preflight tests."""
import os.path as osp

from mmengine.config import Config

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DEMO_CONFIG = osp.join(ROOT, 'configs', 'demo', 'pointpillars_synthetic_kitti_cpu.py')


def demo_config(data_root: str) -> Config:
    """The demo config with every data path moved to ``data_root``."""
    cfg = Config.fromfile(DEMO_CONFIG)
    root = data_root.rstrip('/') + '/'
    train = cfg.train_dataloader.dataset.dataset
    train.data_root = root
    for step in train.pipeline:
        if step['type'] == 'ObjectSample':
            step['db_sampler']['data_root'] = root
            step['db_sampler']['info_path'] = root + 'kitti_dbinfos_train.pkl'
    for key in ('val_dataloader', 'test_dataloader'):
        cfg[key].dataset.data_root = root
    for key in ('val_evaluator', 'test_evaluator'):
        cfg[key].ann_file = root + 'kitti_infos_val.pkl'
    return cfg
