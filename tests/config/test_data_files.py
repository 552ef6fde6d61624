"""Preflight, files that exist: every bad point or info file named before training.

Real files of a generated KITTI set, the demo config, and a real ``ScalingRunner``.
"""
import os
import os.path as osp
import pickle
import shutil

import pytest
from mmengine.runner import Runner

import mmdet3d_scaling  # noqa: F401
from mmdet3d_scaling.config.data_files import SHOWN, BadDataFileError
from mmdet3d_scaling.config.preflight import check_data_paths
from mmdet3d_scaling.datasets.synthetic.kitti import write_kitti
from tests.datasets.synthetic_helpers import demo_config

REDUCED = osp.join('training', 'velodyne_reduced')


@pytest.fixture(scope='module')
def tiny_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('tiny_kitti_files'))
    write_kitti(root, 2, 1, seed=0, progress=False)
    return root


@pytest.fixture
def root(tmp_path, tiny_root):
    out = str(tmp_path / 'kitti')
    shutil.copytree(tiny_root, out)
    return out


def test_complete_set_passes(tiny_root):
    check_data_paths(demo_config(tiny_root))


@pytest.mark.slow
def test_runner_train_names_cut_and_empty_point_files_before_training(root, tmp_path):
    cut = osp.join(root, REDUCED, '000000.bin')
    with open(cut, 'ab') as f:  # `printf abc >> 000000.bin`
        f.write(b'abc')
    empty = osp.join(root, REDUCED, '000001.bin')
    open(empty, 'wb').close()
    cfg = demo_config(root)
    cfg.work_dir = str(tmp_path / 'work')
    cfg.train_dataloader.num_workers = 0
    cfg.train_dataloader.persistent_workers = False
    cfg.train_cfg.max_iters = 1
    runner = Runner.from_cfg(cfg)
    assert type(runner).__name__ == 'ScalingRunner'
    with pytest.raises(BadDataFileError) as err:
        runner.train()
    msg = str(err.value)
    assert (f'train_dataloader.dataset.dataset (KittiDataset): 2 of 2 point files in '
            f'{root}/{REDUCED} that {root}/kitti_infos_train.pkl references cannot be '
            'loaded with load_dim=4') in msg
    size = osp.getsize(cut)
    assert f'{cut} is {size} bytes, not a multiple of 4 (float32)' in msg
    assert f'{empty} is empty (0 bytes)' in msg
    assert (f'python tools/create_synthetic_data.py kitti --out {root} --train-frames 2 '
            '--val-frames 1 --seed 0 --overwrite') in msg
    assert runner.iter == 0 and not any(n.endswith('.pth') for n in os.listdir(cfg.work_dir))


def test_wrong_point_dimension_and_count_of_many(tmp_path):
    root = str(tmp_path / 'kitti8')
    write_kitti(root, 8, 1, seed=0, progress=False)
    cfg = demo_config(root)
    for step in cfg.train_dataloader.dataset.dataset.pipeline:
        if step['type'] == 'LoadPointsFromFile':
            step['load_dim'] = 5  # nuScenes' dimension on KITTI files
    for i in range(8):  # the 8 train frames, 3 points of 4 floats: 48 bytes
        with open(osp.join(root, REDUCED, f'{i:06d}.bin'), 'wb') as f:
            f.write(bytes(48))
    with pytest.raises(BadDataFileError) as err:
        check_data_paths(cfg, loaders=['train_dataloader'], evaluators=[])
    msg = str(err.value)
    assert '8 of 8 point files' in msg
    assert 'is 48 bytes = 12 float32 values, not a multiple of load_dim=5' in msg
    assert 'KITTI: 4, nuScenes: 5' in msg
    assert msg.count('is 48 bytes') == SHOWN
    assert f'... and {8 - SHOWN} more' in msg


def test_val_and_test_share_a_folder_reported_once(root):
    open(osp.join(root, REDUCED, '000002.bin'), 'wb').close()  # the val frame
    with pytest.raises(BadDataFileError) as err:
        check_data_paths(demo_config(root), loaders=['val_dataloader', 'test_dataloader'])
    assert str(err.value).count('000002.bin is empty (0 bytes)') == 1


@pytest.mark.parametrize('old_format', ['infos_key', 'bare_list'])
def test_pre_1x_info_file_named_with_the_converter(root, old_format):
    path = osp.join(root, 'kitti_infos_val.pkl')
    with open(path, 'rb') as f:
        frames = pickle.load(f)['data_list']
    obj = dict(infos=frames, metadata=dict(version='1.0')) if old_format == 'infos_key' \
        else frames
    with open(path, 'wb') as f:
        pickle.dump(obj, f)
    with pytest.raises(BadDataFileError) as err:
        check_data_paths(demo_config(root))
    msg = str(err.value)
    shape = "a dict with keys ['infos', 'metadata']" if old_format == 'infos_key' \
        else 'a bare list'
    assert f"info file ann_file='{path}' is {shape}: the info format of mmdet3d before " \
        '1.0' in msg
    assert (f'python tools/dataset_converters/update_infos_to_v2.py --dataset kitti '
            f'--pkl-path {path} --out-dir {root}/v2') in msg


def test_other_structures_are_named(root):
    path = osp.join(root, 'kitti_infos_train.pkl')
    with open(path, 'wb') as f:
        pickle.dump(dict(frames=[]), f)
    with pytest.raises(BadDataFileError, match=r"is a dict with keys \['frames'\], not an "
                       r"mmdet3d 1.x info file \(a dict with 'data_list' and 'metainfo'\)"):
        check_data_paths(demo_config(root))


def test_opt_out_skips_the_file_checks(root):
    open(osp.join(root, REDUCED, '000001.bin'), 'wb').close()
    cfg = demo_config(root)
    cfg.preflight = dict(check_data=False)
    check_data_paths(cfg)


# --------------------------------------------- referenced files: missing, or not judged
@pytest.mark.slow
def test_runner_train_names_missing_point_files_before_iteration_1(root, tmp_path):
    gone = osp.join(root, REDUCED, '000001.bin')
    os.remove(gone)  # `rm velodyne_reduced/000001.bin`: used to fail after iteration 1
    cfg = demo_config(root)
    cfg.work_dir = str(tmp_path / 'work')
    cfg.train_dataloader.num_workers = 0
    cfg.train_dataloader.persistent_workers = False
    cfg.train_cfg.max_iters = 2
    runner = Runner.from_cfg(cfg)
    with pytest.raises(BadDataFileError) as err:
        runner.train()
    msg = str(err.value)
    assert (f'train_dataloader.dataset.dataset (KittiDataset): 1 of 2 point files that '
            f'{root}/kitti_infos_train.pkl references are missing:\n      {gone}\n') in msg
    assert 'copy the missing files again' in msg
    assert f'create_synthetic_data.py kitti --out {root}' in msg
    assert runner.iter == 0 and not any(n.endswith('.pth') for n in os.listdir(cfg.work_dir))


def test_missing_files_are_counted_with_the_first_few_named(tmp_path):
    root = str(tmp_path / 'kitti8')
    write_kitti(root, 8, 1, seed=0, progress=False)
    for i in range(7):
        os.remove(osp.join(root, REDUCED, f'{i:06d}.bin'))
    with pytest.raises(BadDataFileError) as err:
        check_data_paths(demo_config(root), loaders=['train_dataloader'], evaluators=[])
    msg = str(err.value)
    assert '7 of 8 point files that' in msg
    assert msg.count(osp.join(root, REDUCED)) == SHOWN
    assert f'... and {7 - SHOWN} more' in msg


def test_a_file_no_info_file_references_is_not_judged(root):
    with open(osp.join(root, REDUCED, '999999.bin'), 'wb') as f:
        f.write(b'abc')  # a stray 3-byte file: no frame of any info file names it
    check_data_paths(demo_config(root))


@pytest.fixture(scope='module')
def nus_camera_root(tmp_path_factory):
    from mmdet3d_scaling.datasets.synthetic.nuscenes import (NuScenesSyntheticConfig,
                                                             generate_nuscenes)
    root = str(tmp_path_factory.mktemp('nus_cam') / 'nuscenes')
    generate_nuscenes(NuScenesSyntheticConfig(
        out_dir=root, train_frames=1, val_frames=1, samples_per_scene=1, sweeps=0,
        image_size=(32, 64), objects_per_sample=2, clutter_per_sample=0,
        gt_database=False), progress=False)
    return root


def test_missing_camera_images_of_bevfusion_are_named(tmp_path, nus_camera_root):
    from mmengine.config import Config
    from tests.datasets.synthetic_helpers import ROOT
    root = str(tmp_path / 'nuscenes')
    shutil.copytree(nus_camera_root, root)
    cfg = Config.fromfile(osp.join(ROOT, 'configs', 'bevfusion',
                                   'bevfusion_lidar-cam_synthetic_nus_cpu.py'))
    cfg.val_dataloader.dataset.data_root = root + '/'
    check_data_paths(cfg, loaders=['val_dataloader'], evaluators=[])  # complete: passes
    with open(osp.join(root, 'nuscenes_infos_val.pkl'), 'rb') as f:
        frame = pickle.load(f)['data_list'][0]
    gone = osp.join(root, 'samples', 'CAM_BACK', frame['images']['CAM_BACK']['img_path'])
    os.remove(gone)
    with pytest.raises(BadDataFileError) as err:
        check_data_paths(cfg, loaders=['val_dataloader'], evaluators=[])
    msg = str(err.value)
    assert (f'val_dataloader.dataset (NuScenesDataset): 1 of 6 images that '
            f'{root}/nuscenes_infos_val.pkl references are missing or empty:\n'
            f'      {gone}\n') in msg, msg
