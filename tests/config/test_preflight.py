"""Preflight: a config whose data is missing fails early, naming the path and the fix."""
import os.path as osp

import pytest
from mmengine.config import Config

import mmdet3d_scaling  # noqa: F401
from mmdet3d_scaling.config.preflight import MissingDataError, check_data_paths
from mmdet3d_scaling.datasets.synthetic.kitti import write_kitti
from tests.datasets.synthetic_helpers import demo_config


@pytest.fixture(scope='module')
def tiny_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('tiny_kitti'))
    write_kitti(root, 1, 1, seed=0, progress=False)
    return root


def test_complete_data_passes(tiny_root):
    check_data_paths(demo_config(tiny_root))


def test_missing_data_root_names_it_and_the_command(tmp_path):
    root = str(tmp_path / 'nowhere')
    with pytest.raises(FileNotFoundError) as err:
        check_data_paths(demo_config(root))
    msg = str(err.value)
    assert isinstance(err.value, MissingDataError)
    assert f"data_root '{root}/' does not exist" in msg
    assert f'`python tools/create_synthetic_data.py kitti --out {root}`' in msg
    assert 'train_dataloader.dataset.dataset (KittiDataset)' in msg  # through RepeatDataset
    assert 'val_dataloader.dataset' in msg
    assert 'test_dataloader' not in msg  # same dataset as val: reported once


def test_missing_info_files_named(tmp_path, tiny_root):
    import shutil
    root = str(tmp_path / 'kitti')
    shutil.copytree(tiny_root, root)
    for name in ('kitti_infos_val.pkl', 'kitti_dbinfos_train.pkl'):
        (tmp_path / 'kitti' / name).unlink()
    with pytest.raises(MissingDataError) as err:
        check_data_paths(demo_config(root))
    msg = str(err.value)
    assert f"ann_file='{root}/kitti_infos_val.pkl' does not exist" in msg
    assert f"db_sampler.info_path='{root}/kitti_dbinfos_train.pkl' does not exist" in msg
    assert 'kitti_infos_train.pkl' not in msg
    assert msg.count('python tools/create_synthetic_data.py kitti') == 2


def test_concat_and_cbgs_wrappers_are_followed(tmp_path, tiny_root):
    cfg = demo_config(tiny_root)
    leaf = cfg.train_dataloader.dataset.dataset
    missing = dict(leaf, data_root=str(tmp_path / 'other') + '/')
    cfg.train_dataloader.dataset = dict(
        type='CBGSDataset', dataset=dict(type='ConcatDataset', datasets=[leaf, missing]))
    with pytest.raises(MissingDataError) as err:
        check_data_paths(cfg)
    msg = str(err.value)
    assert 'train_dataloader.dataset.dataset.datasets[1] (KittiDataset)' in msg
    assert str(tmp_path / 'other') in msg
    assert 'datasets[0]' not in msg


def test_unknown_dataset_type_points_to_mmdet3d_tools(tmp_path):
    cfg = Config(dict(train_dataloader=dict(dataset=dict(
        type='WaymoDataset', data_root=str(tmp_path / 'waymo'), ann_file='x.pkl'))))
    with pytest.raises(MissingDataError, match="mmdet3d's `tools/create_data.py`"):
        check_data_paths(cfg)


def test_opt_out_and_remote_paths_skip_the_check(tmp_path):
    cfg = demo_config(str(tmp_path / 'nowhere'))
    cfg.preflight = dict(check_data=False)
    check_data_paths(cfg)
    cfg = Config(dict(train_dataloader=dict(dataset=dict(
        type='KittiDataset', data_root='s3://bucket/kitti/', ann_file='a.pkl'))))
    check_data_paths(cfg)


def _without_training_data(tmp_path, tiny_root) -> str:
    import shutil
    root = str(tmp_path / 'kitti')
    shutil.copytree(tiny_root, root)
    for name in ('kitti_infos_train.pkl', 'kitti_dbinfos_train.pkl'):
        (tmp_path / 'kitti' / name).unlink()
    return root


def test_scaling_runner_checks_only_the_loaders_of_the_command(tmp_path, tiny_root):
    """train() names the missing training files; test() reads neither and runs."""
    from mmengine.runner import Runner
    cfg = demo_config(_without_training_data(tmp_path, tiny_root))
    cfg.work_dir = str(tmp_path / 'work')
    runner = Runner.from_cfg(cfg)
    assert type(runner).__name__ == 'ScalingRunner'
    with pytest.raises(MissingDataError) as err:
        runner.train()
    assert 'kitti_infos_train.pkl' in str(err.value)
    assert 'kitti_dbinfos_train.pkl' in str(err.value)
    metrics = runner.test()
    assert any('KITTI' in key for key in metrics)


def test_stock_config_is_not_checked(tmp_path, tiny_root):
    """Without plugin keys the hand-off leaves the config to mmengine: no preflight."""
    from mmengine.runner import Runner
    cfg = demo_config(_without_training_data(tmp_path, tiny_root))
    for key in ('runner_type', 'patches'):
        cfg.pop(key)
    cfg.work_dir = str(tmp_path / 'work')
    runner = Runner.from_cfg(cfg)
    assert type(runner) is Runner
    runner.test()
