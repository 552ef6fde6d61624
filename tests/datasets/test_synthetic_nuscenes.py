"""Synthetic nuScenes data read by mmdet3d's own NuScenesDataset / NuScenesMetric."""
import filecmp
import os
import os.path as osp
import pickle

import numpy as np
import pytest
import torch

from mmdet3d_scaling.datasets.synthetic.nuscenes import (CLASS_COLORS, NUSCENES_CLASSES,
                                                         NuScenesSyntheticConfig,
                                                         generate_nuscenes)

CLASSES = tuple(NUSCENES_CLASSES)
CAMS = ('CAM_FRONT', 'CAM_FRONT_RIGHT', 'CAM_FRONT_LEFT', 'CAM_BACK', 'CAM_BACK_LEFT',
        'CAM_BACK_RIGHT')
DATA_PREFIX = dict(pts='samples/LIDAR_TOP', sweeps='sweeps/LIDAR_TOP',
                   **{cam: f'samples/{cam}' for cam in CAMS})
IMAGE_SIZE = (128, 352)


def _small(out_dir, seed=0, **kw) -> NuScenesSyntheticConfig:
    args = dict(out_dir=str(out_dir), train_frames=4, val_frames=8, seed=seed,
                samples_per_scene=4, sweeps=2, image_size=IMAGE_SIZE, objects_per_sample=14,
                clutter_per_sample=8)
    args.update(kw)
    return NuScenesSyntheticConfig(**args)


@pytest.fixture(scope='module')
def root(tmp_path_factory):
    out = tmp_path_factory.mktemp('synthetic_nuscenes')
    generate_nuscenes(_small(out), progress=False)
    return str(out)


def _dataset(root, split='train', pipeline=(), test_mode=False, camera=False):
    from mmdet3d.datasets import NuScenesDataset
    from mmengine.registry import init_default_scope

    import mmdet3d_scaling  # noqa: F401  (registers, applies patches)
    init_default_scope('mmdet3d')  # pipeline dicts are built from mmdet3d's registries
    return NuScenesDataset(
        data_root=root, ann_file=f'nuscenes_infos_{split}.pkl', data_prefix=DATA_PREFIX,
        pipeline=list(pipeline), test_mode=test_mode, metainfo=dict(classes=CLASSES),
        modality=dict(use_lidar=True, use_camera=camera))


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    a, b, c = tmp_path / 'a', tmp_path / 'b', tmp_path / 'c'
    for out, seed in ((a, 3), (b, 3), (c, 4)):
        generate_nuscenes(_small(out, seed, train_frames=2, val_frames=2, samples_per_scene=2,
                                 sweeps=1), progress=False)
    files = sorted(osp.relpath(osp.join(d, f), a) for d, _, fs in os.walk(a) for f in fs)
    assert len(files) > 20
    match, mismatch, errors = filecmp.cmpfiles(a, b, files, shallow=False)
    assert not mismatch and not errors
    assert not filecmp.cmp(a / 'nuscenes_infos_train.pkl', c / 'nuscenes_infos_train.pkl',
                           shallow=False)


def test_bad_config_names_the_value(tmp_path):
    with pytest.raises(ValueError, match='sweeps=12'):
        generate_nuscenes(_small(tmp_path / 'x', sweeps=12), progress=False)
    with pytest.raises(ValueError, match="version='v1.0-test'"):
        generate_nuscenes(_small(tmp_path / 'x', version='v1.0-test'), progress=False)
    (tmp_path / 'full').mkdir()
    (tmp_path / 'full' / 'f').write_text('x')
    with pytest.raises(FileExistsError, match='--overwrite'):
        generate_nuscenes(_small(tmp_path / 'full'), progress=False)


def test_scene_names_follow_official_splits():
    from nuscenes.utils import splits
    from mmdet3d_scaling.datasets.synthetic.nuscenes import _split_scenes
    scenes = _split_scenes('v1.0-trainval', 'train', 25, 10)
    assert scenes == list(zip(splits.train[:3], [9, 8, 8]))
    scenes = _split_scenes('v1.0-mini', 'val', 30, 10)  # only 2 mini_val scenes exist
    assert [name for name, _ in scenes] == splits.mini_val
    assert sum(n for _, n in scenes) == 30


def test_info_files_are_v2_nuscenes(root):
    with open(osp.join(root, 'nuscenes_infos_val.pkl'), 'rb') as f:
        infos = pickle.load(f)
    meta = infos['metainfo']
    assert meta['dataset'] == 'nuscenes' and meta['version'] == 'v1.0-trainval'
    assert meta['info_version'] == '1.1' and list(meta['categories']) == list(CLASSES)
    assert len(infos['data_list']) == 8
    info = infos['data_list'][5]
    assert info['sample_idx'] == 5 and set(info['images']) == set(CAMS)
    assert info['lidar_points']['num_pts_feats'] == 5
    assert 1 <= len(info['lidar_sweeps']) <= 10
    for key in ('img_path', 'cam2img', 'lidar2cam', 'cam2ego', 'lidar2img',
                'sample_data_token', 'timestamp'):
        assert key in info['images']['CAM_FRONT'], key
    inst = info['instances'][0]
    for key in ('bbox_3d', 'bbox_label_3d', 'velocity', 'num_lidar_pts', 'num_radar_pts',
                'bbox_3d_isvalid'):
        assert key in inst, key
    assert set(info['cam_instances']) == set(CAMS)
    points = np.fromfile(osp.join(root, 'samples/LIDAR_TOP', info['lidar_points']['lidar_path']),
                         np.float32).reshape(-1, 5)
    assert len(points) > 5000
    assert points[:, 3].max() <= 255 and set(np.unique(points[:, 4])) <= set(range(32))


def test_lidar_pipeline_and_points_in_boxes(root):
    from mmcv.ops import points_in_boxes_cpu
    pipeline = [
        dict(type='LoadPointsFromFile', coord_type='LIDAR', load_dim=5, use_dim=5),
        dict(type='LoadPointsFromMultiSweeps', sweeps_num=9, use_dim=[0, 1, 2, 3, 4],
             pad_empty_sweeps=True, remove_close=True),
        dict(type='LoadAnnotations3D', with_bbox_3d=True, with_label_3d=True),
        dict(type='ObjectRangeFilter', point_cloud_range=[-54, -54, -5, 54, 54, 3]),
        dict(type='Pack3DDetInputs', keys=['points', 'gt_bboxes_3d', 'gt_labels_3d']),
    ]
    dataset = _dataset(root, 'train', pipeline)
    assert len(dataset) == 4
    single = np.fromfile(dataset.get_data_info(3)['lidar_path'], np.float32).reshape(-1, 5)
    item = dataset[3]
    points = item['inputs']['points']
    assert points.shape[1] == 5 and len(points) > 2 * len(single)  # sweeps were added
    gt = item['data_samples'].gt_instances_3d
    assert gt.bboxes_3d.tensor.shape[1] == 9 and len(gt.labels_3d) > 5

    # every annotated box contains exactly its num_lidar_pts key-frame points
    info = dataset.get_data_info(3)
    ann = info['ann_info']
    boxes = ann['gt_bboxes_3d'].tensor[:, :7].float()[None]
    inside = points_in_boxes_cpu(torch.from_numpy(single[None, :, :3]), boxes)[0]
    assert torch.equal(inside.sum(0).long(), torch.as_tensor(ann['num_lidar_pts']).long())
    assert (ann['num_lidar_pts'] > 0).all()


def test_gt_database_feeds_object_sample(root):
    with open(osp.join(root, 'nuscenes_dbinfos_train.pkl'), 'rb') as f:
        db = pickle.load(f)
    assert set(db) <= set(CLASSES) and len(db) >= 8
    entries = [e for per_class in db.values() for e in per_class]
    assert sorted(e['group_id'] for e in entries) == list(range(len(entries)))
    for entry in entries[:50]:
        pts = np.fromfile(osp.join(root, entry['path']), np.float32).reshape(-1, 5)
        assert len(pts) == entry['num_points_in_gt'] > 0
        box = entry['box3d_lidar']
        assert box.shape == (9,)
        c, s = np.cos(box[6]), np.sin(box[6])  # points relative to the bottom centre
        local_x = c * pts[:, 0] + s * pts[:, 1]
        local_y = -s * pts[:, 0] + c * pts[:, 1]
        assert (np.abs(local_x) <= box[3] / 2 + 1e-3).all()
        assert (np.abs(local_y) <= box[4] / 2 + 1e-3).all()
        assert (pts[:, 2] >= -1e-3).all() and (pts[:, 2] <= box[5] + 1e-3).all()

    db_sampler = dict(
        data_root=root, info_path=osp.join(root, 'nuscenes_dbinfos_train.pkl'), rate=1.0,
        prepare=dict(filter_by_difficulty=[-1],
                     filter_by_min_points={name: 1 for name in CLASSES}),
        classes=list(CLASSES), sample_groups={name: 2 for name in CLASSES},
        points_loader=dict(type='LoadPointsFromFile', coord_type='LIDAR', load_dim=5,
                           use_dim=[0, 1, 2, 3, 4]))
    pipeline = [
        dict(type='LoadPointsFromFile', coord_type='LIDAR', load_dim=5, use_dim=5),
        dict(type='LoadPointsFromMultiSweeps', sweeps_num=9, use_dim=[0, 1, 2, 3, 4],
             pad_empty_sweeps=True, remove_close=True),
        dict(type='LoadAnnotations3D', with_bbox_3d=True, with_label_3d=True),
        dict(type='ObjectSample', db_sampler=db_sampler),
        dict(type='Pack3DDetInputs', keys=['points', 'gt_bboxes_3d', 'gt_labels_3d']),
    ]
    dataset = _dataset(root, 'train', pipeline)
    n_before = len(dataset.get_data_info(0)['ann_info']['gt_labels_3d'])
    assert len(dataset[0]['data_samples'].gt_instances_3d.labels_3d) > n_before


def test_multiview_images_load_with_lidar(root):
    pipeline = [
        dict(type='LoadPointsFromFile', coord_type='LIDAR', load_dim=5, use_dim=5),
        dict(type='LoadMultiViewImageFromFiles', to_float32=True, num_views=6),
        dict(type='LoadAnnotations3D', with_bbox_3d=True, with_label_3d=True),
        dict(type='Pack3DDetInputs', keys=['points', 'img', 'gt_bboxes_3d', 'gt_labels_3d'],
             meta_keys=['lidar2img', 'lidar2cam', 'cam2img', 'img_path']),
    ]
    dataset = _dataset(root, 'val', pipeline, camera=True)
    item = dataset[0]
    img = item['inputs']['img']
    assert tuple(img.shape) == (6, 3, *IMAGE_SIZE)
    assert len(item['data_samples'].metainfo['img_path']) == 6


def _visible_instances(info):
    """(cam, instance) pairs whose projected centre no nearer instance's 2D box covers."""
    for cam, insts in info['cam_instances'].items():
        for inst in insts:
            u, v = inst['center_2d']
            if not (2 <= u < IMAGE_SIZE[1] - 2 and 2 <= v < IMAGE_SIZE[0] - 2):
                continue
            covered = any(o is not inst and o['depth'] < inst['depth'] + 3
                          and o['bbox'][0] - 2 <= u <= o['bbox'][2] + 2
                          and o['bbox'][1] - 2 <= v <= o['bbox'][3] + 2 for o in insts)
            if not covered:
                yield cam, inst


def test_objects_drawn_where_they_project(root):
    import mmcv
    dataset = _dataset(root, 'val', camera=True)
    checked = 0
    for idx in range(len(dataset)):
        info = dataset.get_data_info(idx)
        lidar_boxes = {tuple(np.round(i['bbox_3d'], 3)) for i in info['instances']}
        for cam, inst in _visible_instances(info):
            img = mmcv.imread(info['images'][cam]['img_path'], channel_order='rgb')
            u, v = (int(round(c)) for c in inst['center_2d'])
            pixel = img[v - 1:v + 2, u - 1:u + 2].reshape(-1, 3).mean(0)
            colour = np.asarray(CLASS_COLORS[CLASSES[inst['bbox_label_3d']]], float)
            # same colour up to shading: compare chromaticity
            assert np.abs(pixel / (pixel.sum() + 1) - colour / colour.sum()).max() < 0.06, (
                cam, CLASSES[inst['bbox_label_3d']], pixel, colour)
            checked += 1
        # lidar2img maps the LiDAR-frame box centre onto the camera instance's centre
        for cam, insts in info['cam_instances'].items():
            lidar2img = np.asarray(info['images'][cam]['lidar2img'])
            for inst in insts:
                matches = []
                for box in info['instances']:
                    p = lidar2img @ np.array([*box['bbox_3d'][:3], 1.0])
                    gap = np.hypot(*(p[:2] / p[2] - inst['center_2d'])) if p[2] > 0 else 1e9
                    matches.append(gap)
                assert min(matches) < 1e-2
        assert lidar_boxes
    assert checked >= 20


def test_tables_agree_with_infos(root):
    from nuscenes import NuScenes
    from pyquaternion import Quaternion
    nusc = NuScenes(version='v1.0-trainval', dataroot=root, verbose=False)
    with open(osp.join(root, 'nuscenes_infos_val.pkl'), 'rb') as f:
        infos = pickle.load(f)['data_list']
    for info in infos[:4]:
        sample = nusc.get('sample', info['token'])
        _, boxes, _ = nusc.get_sample_data(sample['data']['LIDAR_TOP'])
        assert len(boxes) == len(info['instances'])
        sd = nusc.get('sample_data', sample['data']['LIDAR_TOP'])
        pose = nusc.get('ego_pose', sd['ego_pose_token'])
        cs = nusc.get('calibrated_sensor', sd['calibrated_sensor_token'])
        g2l = (np.linalg.inv(Quaternion(cs['rotation']).rotation_matrix)
               @ np.linalg.inv(Quaternion(pose['rotation']).rotation_matrix))
        for box, inst in zip(boxes, info['instances']):
            # mmdet3d's converter: centre, (l, w, h), yaw of the devkit box in the LiDAR frame
            ours = np.asarray(inst['bbox_3d'])
            assert np.allclose(box.center, ours[:3], atol=1e-3)
            assert np.allclose(box.wlh[[1, 0, 2]], ours[3:6], atol=1e-4)
            d_yaw = (box.orientation.yaw_pitch_roll[0] - ours[6] + np.pi) % (2 * np.pi) - np.pi
            assert abs(d_yaw) < 1e-4
            velocity = (g2l @ nusc.box_velocity(box.token))[:2]
            assert np.allclose(velocity, inst['velocity'], atol=1e-3)
        for cam in CAMS:
            assert nusc.get('sample_data', sample['data'][cam])['filename'].endswith(
                info['images'][cam]['img_path'])


def _predictions(dataset, shift=0):
    """GT of sample (i + shift) as the predictions for sample i."""
    from mmdet3d.structures import LiDARInstance3DBoxes
    results = []
    n = len(dataset)
    for i in range(n):
        ann = dataset.get_data_info((i + shift) % n)['eval_ann_info']
        boxes = ann['gt_bboxes_3d']
        results.append(dict(
            pred_instances_3d=dict(
                bboxes_3d=LiDARInstance3DBoxes(boxes.tensor.clone(), box_dim=9),
                scores_3d=torch.linspace(1.0, 0.5, len(boxes)),
                labels_3d=torch.as_tensor(ann['gt_labels_3d'])),
            pred_instances=dict(), sample_idx=i))
    return results


def test_metric_on_ground_truth_and_on_shuffled(root, tmp_path):
    from mmdet3d.evaluation.metrics import NuScenesMetric
    dataset = _dataset(root, 'val', test_mode=True)
    metric = NuScenesMetric(data_root=root, ann_file=osp.join(root, 'nuscenes_infos_val.pkl'),
                            metric='bbox', jsonfile_prefix=str(tmp_path / 'gt'))
    metric.dataset_meta = dataset.metainfo
    perfect = metric.compute_metrics(_predictions(dataset))
    assert perfect['pred_instances_3d_NuScenes/mAP'] > 0.97
    assert perfect['pred_instances_3d_NuScenes/NDS'] > 0.9
    metric.jsonfile_prefix = str(tmp_path / 'shuffled')
    shuffled = metric.compute_metrics(_predictions(dataset, shift=4))
    assert shuffled['pred_instances_3d_NuScenes/mAP'] < 0.2


def test_metric_without_detections_reports_zero(root, tmp_path):
    # mmdet3d 1.4 + devkit crash on an empty result ("Invalid box type: None");
    # mmdet3d_scaling.patches.fixes.nuscenes_metric reports zeros instead.
    from mmdet3d.evaluation.metrics import NuScenesMetric
    from mmdet3d.structures import LiDARInstance3DBoxes
    dataset = _dataset(root, 'val', test_mode=True)
    metric = NuScenesMetric(data_root=root, ann_file=osp.join(root, 'nuscenes_infos_val.pkl'),
                            metric='bbox', jsonfile_prefix=str(tmp_path / 'empty'))
    metric.dataset_meta = dataset.metainfo
    empty = [dict(pred_instances_3d=dict(
        bboxes_3d=LiDARInstance3DBoxes(torch.zeros(0, 9), box_dim=9),
        scores_3d=torch.zeros(0), labels_3d=torch.zeros(0, dtype=torch.long)),
        pred_instances=dict(), sample_idx=i) for i in range(len(dataset))]
    result = metric.compute_metrics(empty)
    assert result['pred_instances_3d_NuScenes/mAP'] == 0.0
    assert result['pred_instances_3d_NuScenes/NDS'] == 0.0
