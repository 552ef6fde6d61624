"""Preflight: a config whose data is missing fails early, naming the path and the fix."""
import os
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_stock_config_is_not_checked(tmp_path, tiny_root):
    """Without plugin keys the hand-off leaves the config to mmengine: no preflight."""
    from mmengine.runner import Runner
    cfg = demo_config(_without_training_data(tmp_path, tiny_root))
    for key in ('runner_type', 'patches', 'custom_hooks'):  # the plugin's keys
        cfg.pop(key)
    cfg.work_dir = str(tmp_path / 'work')
    runner = Runner.from_cfg(cfg)
    assert type(runner) is Runner
    runner.test()


# ---------------------------------------------------------------- real vs synthetic roots
def _real_kitti_root(tmp_path, tiny_root) -> str:
    """A data_root that looks like a real dataset: data, no generator marker, no infos."""
    import shutil
    root = tmp_path / 'data' / 'kitti'
    shutil.copytree(tiny_root, root)
    for name in ('.synthetic_kitti', 'kitti_infos_train.pkl', 'kitti_infos_val.pkl'):
        (root / name).unlink()
    return str(root)


def test_real_data_root_gets_converter_and_separate_synthetic_folder(
        tmp_path, tiny_root, monkeypatch):
    """Never `--out <real data_root>`; the suggested folder and options work as given."""
    root = _real_kitti_root(tmp_path, tiny_root)
    monkeypatch.chdir(tmp_path)  # the suggested folder is relative: data/synthetic_kitti
    cfg = demo_config(root)
    with pytest.raises(MissingDataError) as err:
        check_data_paths(cfg)
    msg = str(err.value)
    assert f'--out {root}' not in msg
    assert (f"mmdet3d's `python tools/create_data.py kitti --root-path {root} "
            f'--out-dir {root}') in msg
    assert 'without the generator\'s .synthetic_kitti marker' in msg
    assert 'python tools/create_synthetic_data.py kitti --out data/synthetic_kitti\n' in msg
    assert 'preflight = dict(check_data=False)' in msg
    options = msg.split('--cfg-options ')[-1].splitlines()[0].split()
    keys = {o.split('=', 1)[0] for o in options}
    assert {'train_dataloader.dataset.dataset.data_root',
            'train_dataloader.dataset.dataset.pipeline.2.db_sampler.info_path',
            'val_dataloader.dataset.data_root', 'test_dataloader.dataset.data_root',
            'val_evaluator.ann_file', 'test_evaluator.ann_file'} <= keys
    # follow the advice literally: generate there, apply the options, the check passes
    write_kitti('data/synthetic_kitti', 1, 1, seed=0, progress=False)
    cfg.merge_from_dict(dict(o.split('=', 1) for o in options))
    check_data_paths(cfg)
    assert not osp.exists(osp.join(root, '.synthetic_kitti'))  # the real root untouched


def test_separate_folder_skips_a_taken_one(tmp_path, tiny_root, monkeypatch):
    root = _real_kitti_root(tmp_path, tiny_root)
    monkeypatch.chdir(tmp_path)
    os.makedirs('data/synthetic_kitti')
    open('data/synthetic_kitti/notes.txt', 'w').close()  # someone else's files
    with pytest.raises(MissingDataError) as err:
        check_data_paths(demo_config(root))
    assert '--out data/synthetic_kitti_2\n' in str(err.value)


def test_generator_made_root_is_regenerated_in_place(tmp_path, tiny_root):
    import shutil
    root = str(tmp_path / 'kitti')
    shutil.copytree(tiny_root, root)
    os.remove(osp.join(root, 'kitti_infos_train.pkl'))
    with pytest.raises(MissingDataError) as err:
        check_data_paths(demo_config(root))
    msg = str(err.value)
    assert f'`python tools/create_synthetic_data.py kitti --out {root} --overwrite`' in msg
    assert 'separate folder' not in msg


def test_empty_info_files_are_reported(tmp_path, tiny_root):
    import shutil
    root = str(tmp_path / 'kitti')
    shutil.copytree(tiny_root, root)
    for name in ('kitti_infos_train.pkl', 'kitti_dbinfos_train.pkl'):
        open(osp.join(root, name), 'wb').close()
    with pytest.raises(MissingDataError) as err:
        check_data_paths(demo_config(root))
    msg = str(err.value)
    assert f"ann_file='{root}/kitti_infos_train.pkl' is empty (0 bytes" in msg
    assert f"info_path='{root}/kitti_dbinfos_train.pkl' is empty (0 bytes" in msg


# ------------------------------------------------------------------ nuScenes devkit tables
def _nuscenes_cfg(root: str, version: str = '') -> Config:
    metainfo = dict(version=version) if version else {}
    dataset = dict(type='NuScenesDataset', data_root=root + '/', metainfo=metainfo,
                   ann_file='nuscenes_infos_val.pkl', data_prefix=dict(pts='samples/LIDAR_TOP'))
    return Config(dict(val_dataloader=dict(dataset=dataset), val_evaluator=dict(
        type='NuScenesMetric', data_root=root + '/',
        ann_file=root + '/nuscenes_infos_val.pkl')))


@pytest.fixture(scope='module')
def nus_root(tmp_path_factory):
    from mmdet3d_scaling.datasets.synthetic.nuscenes import (NuScenesSyntheticConfig,
                                                             generate_nuscenes)
    root = str(tmp_path_factory.mktemp('nus') / 'nuscenes')
    generate_nuscenes(NuScenesSyntheticConfig(
        out_dir=root, train_frames=1, val_frames=1, samples_per_scene=1, sweeps=0,
        image_size=(32, 64), objects_per_sample=2, clutter_per_sample=0,
        gt_database=False), progress=False)
    return root


def test_nuscenes_metric_tables_checked(tmp_path, nus_root):
    import shutil
    check_data_paths(_nuscenes_cfg(nus_root))  # complete: passes
    root = str(tmp_path / 'nuscenes')
    shutil.copytree(nus_root, root)
    os.remove(osp.join(root, 'v1.0-trainval', 'sample_annotation.json'))
    with pytest.raises(MissingDataError) as err:
        check_data_paths(_nuscenes_cfg(root))
    msg = str(err.value)
    assert 'val_evaluator (NuScenesMetric)' in msg
    assert f'{root}/v1.0-trainval/ lacks sample_annotation.json' in msg
    assert f'create_synthetic_data.py nuscenes --out {root} --overwrite' in msg
    assert 'preflight = dict(check_data=False)' in msg


def test_nuscenes_other_version_is_pointed_out(tmp_path, nus_root):
    import shutil
    root = str(tmp_path / 'nuscenes')
    shutil.copytree(nus_root, root)
    os.rename(osp.join(root, 'v1.0-trainval'), osp.join(root, 'v1.0-mini'))
    os.remove(osp.join(root, '.synthetic_nuscenes'))  # as real data
    with pytest.raises(MissingDataError) as err:
        check_data_paths(_nuscenes_cfg(root))
    msg = str(err.value)
    assert f'{root}/v1.0-trainval/ does not exist' in msg
    assert "metainfo=dict(version='v1.0-mini')" in msg
    assert f'--out {root}' not in msg and 'create_data.py nuscenes' in msg
    check_data_paths(_nuscenes_cfg(root, version='v1.0-mini'))
