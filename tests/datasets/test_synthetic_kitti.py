"""Synthetic KITTI data: deterministic, read by the real KittiDataset and pipeline."""
import copy
import os
import os.path as osp
import pickle

import numpy as np
import pytest
import torch

import mmdet3d_scaling  # noqa: F401
from mmdet3d_scaling.patches.fixes.point_loading import CorruptPointCloudError
from mmdet3d_scaling.datasets.synthetic.kitti import write_kitti
from tests.datasets.synthetic_helpers import ROOT, demo_config

TRAIN, VAL = 6, 3


@pytest.fixture(scope='module')
def kitti_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('synthetic_kitti'))
    write_kitti(root, TRAIN, VAL, seed=0, progress=False)
    return root


def _files(root):
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = osp.join(dirpath, name)
            with open(path, 'rb') as f:
                out[osp.relpath(path, root)] = f.read()
    return out


def _build(cfg_dataset):
    from mmdet3d.registry import DATASETS
    from mmengine.registry import init_default_scope
    init_default_scope('mmdet3d')
    return DATASETS.build(copy.deepcopy(cfg_dataset))


def test_same_seed_same_bytes(tmp_path, kitti_root):
    write_kitti(str(tmp_path / 'a'), TRAIN, VAL, seed=0, progress=False)
    write_kitti(str(tmp_path / 'b'), TRAIN, VAL, seed=1, progress=False)
    again, other, first = _files(tmp_path / 'a'), _files(tmp_path / 'b'), _files(kitti_root)
    assert again == first
    fixed = {k for k in again if not k.startswith('kitti_gt_database')}
    assert fixed <= other.keys()
    assert again['training/velodyne/000000.bin'] != other['training/velodyne/000000.bin']


def test_layout_and_info_format(kitti_root):
    expected = ['ImageSets/train.txt', 'ImageSets/val.txt', 'ImageSets/trainval.txt',
                'kitti_infos_train.pkl', 'kitti_infos_val.pkl', 'kitti_infos_trainval.pkl',
                'kitti_dbinfos_train.pkl']
    for sub in ('velodyne', 'velodyne_reduced', 'calib', 'label_2', 'image_2', 'planes'):
        ext = {'image_2': 'png', 'velodyne': 'bin', 'velodyne_reduced': 'bin'}.get(sub, 'txt')
        expected += [f'training/{sub}/{i:06d}.{ext}' for i in range(TRAIN + VAL)]
    missing = [p for p in expected if not osp.isfile(osp.join(kitti_root, p))]
    assert not missing
    with open(osp.join(kitti_root, 'ImageSets', 'val.txt')) as f:
        assert f.read().split() == [f'{i:06d}' for i in range(TRAIN, TRAIN + VAL)]

    with open(osp.join(kitti_root, 'kitti_infos_train.pkl'), 'rb') as f:
        infos = pickle.load(f)
    assert infos['metainfo'] == dict(
        categories={'Pedestrian': 0, 'Cyclist': 1, 'Car': 2, 'Van': 3, 'Truck': 4,
                    'Person_sitting': 5, 'Tram': 6, 'Misc': 7},
        dataset='kitti', info_version='1.1')
    info = infos['data_list'][0]
    assert set(info['images']) == {'CAM0', 'CAM1', 'CAM2', 'CAM3', 'R0_rect'}
    cam2 = info['images']['CAM2']
    lidar2img = np.array(cam2['cam2img']) @ np.array(cam2['lidar2cam'])
    np.testing.assert_allclose(lidar2img, np.array(cam2['lidar2img']), atol=1e-9)
    assert set(info['lidar_points']) == {'num_pts_feats', 'lidar_path', 'Tr_velo_to_cam',
                                         'Tr_imu_to_velo'}
    assert info['lidar_points']['num_pts_feats'] == 4
    inst_keys = {'bbox', 'bbox_label', 'bbox_3d', 'bbox_label_3d', 'depth', 'center_2d',
                 'num_lidar_pts', 'difficulty', 'truncated', 'occluded', 'alpha', 'score',
                 'index', 'group_id'}
    all_instances = [i for d in infos['data_list'] for i in d['instances']]
    assert all_instances and all(set(i) == inst_keys for i in all_instances)
    assert {i['bbox_label'] for i in all_instances} == {0, 1, 2}

    # the calib file says what the info says
    with open(osp.join(kitti_root, 'training', 'calib', '000000.txt')) as f:
        calib = {k: np.array(v.split(), float) for k, v in
                 (line.split(':', 1) for line in f if ':' in line)}
    np.testing.assert_allclose(calib['P2'].reshape(3, 4), np.array(cam2['cam2img'])[:3])
    import cv2
    img = cv2.imread(osp.join(kitti_root, 'training', 'image_2', '000000.png'))
    assert img.shape == (cam2['height'], cam2['width'], 3)
    # 2D box = projected 3D box: its centre_2d lies inside it
    for inst in info['instances']:
        x1, y1, x2, y2 = inst['bbox']
        u, v = inst['center_2d']
        if inst['truncated'] == 0:
            assert x1 <= u <= x2 and y1 <= v <= y2


def test_boxes_contain_their_points(kitti_root):
    """Through the real KittiDataset: LiDAR boxes hold exactly num_lidar_pts points."""
    from mmcv.ops import points_in_boxes_cpu
    cfg = demo_config(kitti_root)
    ds_cfg = copy.deepcopy(cfg.train_dataloader.dataset.dataset)
    ds_cfg.pipeline = [dict(type='LoadPointsFromFile', coord_type='LIDAR', load_dim=4,
                            use_dim=4),
                       dict(type='LoadAnnotations3D', with_bbox_3d=True,
                            with_label_3d=True)]
    dataset = _build(ds_cfg)
    assert len(dataset) == TRAIN
    checked = 0
    for idx in range(len(dataset)):
        info = dataset.get_data_info(idx)
        out = dataset.pipeline(info)
        boxes = out['gt_bboxes_3d'].tensor
        points = out['points'].tensor[:, :3]
        inside = points_in_boxes_cpu(points[None], boxes[None])[0]  # (points, boxes)
        expected = [inst['num_lidar_pts'] for inst in info['instances']]
        assert inside.sum(0).tolist() == expected
        assert min(expected) >= 1
        checked += len(expected)
    assert checked > 10


def test_gt_database_matches_boxes(kitti_root):
    with open(osp.join(kitti_root, 'kitti_dbinfos_train.pkl'), 'rb') as f:
        db = pickle.load(f)
    assert set(db) == {'Car', 'Pedestrian', 'Cyclist'}
    for name, entries in db.items():
        for e in entries:
            assert e['name'] == name and e['box3d_lidar'].shape == (7,)
            pts = np.fromfile(osp.join(kitti_root, e['path']), np.float32).reshape(-1, 4)
            assert len(pts) == e['num_points_in_gt']
            l, w, h = e['box3d_lidar'][3:6]
            yaw = e['box3d_lidar'][6]
            c, s = np.cos(yaw), np.sin(yaw)
            lx = c * pts[:, 0] + s * pts[:, 1]
            ly = -s * pts[:, 0] + c * pts[:, 1]
            assert (np.abs(lx) <= l / 2).all() and (np.abs(ly) <= w / 2).all()
            assert ((pts[:, 2] >= 0) & (pts[:, 2] <= h)).all()


def test_train_pipeline_with_object_sample(kitti_root):
    """The demo's training pipeline, ObjectSample with the generated db included."""
    np.random.seed(0)
    cfg = demo_config(kitti_root)
    dataset = _build(cfg.train_dataloader.dataset.dataset)
    n_before = sum(len(dataset.get_data_info(i)['instances']) for i in range(len(dataset)))
    n_after = 0
    for idx in range(len(dataset)):
        sample = dataset[idx]
        pts = sample['inputs']['points']
        assert pts.ndim == 2 and pts.shape[1] == 4
        gt = sample['data_samples'].gt_instances_3d
        assert set(gt.labels_3d.tolist()) <= {0, 1, 2}
        n_after += len(gt.labels_3d)
    assert n_after > n_before  # objects pasted from the ground-truth database


def test_corrupt_point_file_is_named(kitti_root, tmp_path):
    import shutil
    root = str(tmp_path / 'kitti')
    shutil.copytree(kitti_root, root)
    bad = osp.join(root, 'training', 'velodyne_reduced', f'{TRAIN:06d}.bin')
    with open(bad, 'r+b') as f:  # cut two float32 values: not a multiple of 4 columns
        f.truncate(os.path.getsize(bad) - 8)
    cfg = demo_config(root)
    dataset = _build(cfg.test_dataloader.dataset)
    with pytest.raises(CorruptPointCloudError, match=f'{TRAIN:06d}.bin') as err:
        dataset[0]
    assert 'load_dim=4' in str(err.value)


def test_cli_writes_dataset_and_rejects_empty_split(tmp_path):
    import sys
    sys.path.insert(0, osp.join(ROOT, 'tools'))
    try:
        import create_synthetic_data
    finally:
        sys.path.pop(0)
    out = str(tmp_path / 'cli')
    summary = create_synthetic_data.main(['kitti', '--out', out, '--train-frames', '2',
                                          '--val-frames', '1', '--seed', '3',
                                          '--no-progress'])
    assert summary['train_frames'] == 2 and osp.isfile(osp.join(out, 'kitti_infos_val.pkl'))
    with pytest.raises(ValueError, match='val_frames=0'):
        create_synthetic_data.main(['kitti', '--out', out, '--val-frames', '0',
                                    '--no-progress'])


@pytest.mark.slow
def test_short_training_lowers_the_loss(kitti_root, tmp_path):
    """A real Runner trains the demo's PointPillars on the generated frames."""
    from mmengine.runner import Runner
    cfg = demo_config(kitti_root)
    iters = 24
    cfg.work_dir = str(tmp_path / 'work')
    cfg.train_dataloader.batch_size = 2
    cfg.train_dataloader.num_workers = 0
    cfg.train_dataloader.persistent_workers = False
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=iters, val_interval=iters + 1)
    cfg.val_dataloader = cfg.val_cfg = cfg.val_evaluator = None
    cfg.test_dataloader = cfg.test_cfg = cfg.test_evaluator = None
    cfg.param_scheduler = []
    cfg.optim_wrapper.optimizer.lr = 0.003
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', interval=-1)
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=1)
    cfg.log_level = 'WARNING'
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # OpenMP threads spin-wait on a busy 2-core machine
    try:
        runner = Runner.from_cfg(cfg)
        runner.train()
    finally:
        torch.set_num_threads(threads)
    losses = runner.message_hub.get_scalar('train/loss').data[0]
    assert len(losses) == iters
    first, last = np.mean(losses[:4]), np.mean(losses[-4:])
    assert last < 0.8 * first, (first, last)
