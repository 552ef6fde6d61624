"""BEVFusion data transforms: image/LiDAR augmentation matrices agree with what the
transforms do to pixels, points and boxes; multi-view loading from real files."""
import numpy as np
import pytest
import torch
from PIL import Image

import mmdet3d_scaling  # noqa: F401  (registers the transforms)
from mmdet3d.registry import TRANSFORMS
from mmengine.registry import init_default_scope


@pytest.fixture(autouse=True)
def mmdet3d_scope():
    # Earlier tests' Runners leave another default scope; unscoped names resolve in it.
    init_default_scope('mmdet3d')
from mmdet3d.structures import LiDARInstance3DBoxes
from mmdet3d.structures.points import LiDARPoints

CAMS = ['CAM_FRONT', 'CAM_FRONT_RIGHT', 'CAM_FRONT_LEFT', 'CAM_BACK', 'CAM_BACK_LEFT',
        'CAM_BACK_RIGHT']


def Compose(cfgs):
    """mmdet3d-scoped pipeline (mmcv's Compose would look in the root registry)."""
    transforms = [TRANSFORMS.build(c) for c in cfgs]

    def run(results):
        for t in transforms:
            results = t(results)
        return results

    return run


def dot_images(h=128, w=352, n=6):
    """Black images with one bright 4 x 4 square each; returns images and centres."""
    imgs, centres = [], []
    rng = np.random.RandomState(0)
    for _ in range(n):
        u, v = rng.randint(60, w - 60), rng.randint(40, h - 40)
        img = np.zeros((h, w, 3), np.float32)
        img[v - 2:v + 2, u - 2:u + 2] = 255.0
        imgs.append(img)
        centres.append((u - 0.5, v - 0.5))  # centre of the square in pixel coords
    return imgs, centres


def bright_centroid(img):
    weight = img[..., 0].astype(np.float64)
    vs, us = np.mgrid[:img.shape[0], :img.shape[1]]
    return (weight * us).sum() / weight.sum(), (weight * vs).sum() / weight.sum()


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_image_aug_matrix_moves_pixels_where_the_image_went(seed):
    np.random.seed(seed)
    aug = TRANSFORMS.build(dict(type='ImageAug3D', final_dim=[64, 176],
                                resize_lim=[0.55, 0.65], bot_pct_lim=[0.0, 0.1],
                                rot_lim=[-10.0, 10.0], rand_flip=True, is_train=True))
    imgs, centres = dot_images()
    out = aug(dict(img=imgs, ori_shape=(128, 352)))
    assert len(out['img']) == 6 and len(out['img_aug_matrix']) == 6
    for img, matrix, (u, v) in zip(out['img'], out['img_aug_matrix'], centres):
        assert img.shape == (64, 176, 3) and img.dtype == np.float32
        assert matrix.shape == (4, 4)
        pu, pv = (matrix @ np.array([u, v, 0.0, 1.0]))[:2]
        if 3 <= pu < 173 and 3 <= pv < 61:  # the square stayed in the crop
            cu, cv = bright_centroid(img)
            assert abs(cu - pu) < 1.5 and abs(cv - pv) < 1.5


def test_image_aug_test_mode_is_deterministic_centre_crop():
    aug = TRANSFORMS.build(dict(type='ImageAug3D', final_dim=[64, 176],
                                resize_lim=[0.6, 0.6], bot_pct_lim=[0.0, 0.0],
                                rot_lim=[0.0, 0.0], rand_flip=False, is_train=False))
    imgs, _ = dot_images()
    out = aug(dict(img=imgs, ori_shape=(128, 352)))
    # resize 0.6 -> 211 x 76, crop x from (211 - 176) // 2 = 17, y from 76 - 64 = 12
    expected = np.eye(4, dtype=np.float32)
    expected[:2, :2] *= 0.6
    expected[:2, 3] = [-17.0, -12.0]
    for matrix in out['img_aug_matrix']:
        np.testing.assert_allclose(matrix, expected, atol=1e-6)
    assert out['img_shape'] == (64, 176)


def lidar_scene(n_points=50, seed=0):
    rng = np.random.RandomState(seed)
    pts = rng.uniform(-20, 20, (n_points, 5)).astype(np.float32)
    boxes = LiDARInstance3DBoxes(torch.tensor(
        [[5.0, 3.0, -1.0, 4.0, 2.0, 1.5, 0.3], [-8.0, 2.0, -0.5, 1.0, 1.0, 2.0, -1.0]]))
    return dict(points=LiDARPoints(pts, points_dim=5), gt_bboxes_3d=boxes,
                gt_labels_3d=np.array([0, 8])), pts[:, :3].copy(), boxes.tensor.clone()


def homogeneous(xyz):
    return np.concatenate([xyz, np.ones((len(xyz), 1))], 1)


def assert_aug_matrix_maps(results, orig_pts, orig_boxes):
    m = np.asarray(results['lidar_aug_matrix'])
    moved = (m @ homogeneous(orig_pts).T).T[:, :3]
    np.testing.assert_allclose(results['points'].tensor[:, :3].numpy(), moved,
                               rtol=1e-5, atol=1e-4)
    moved_boxes = (m @ homogeneous(orig_boxes[:, :3].numpy()).T).T[:, :3]
    np.testing.assert_allclose(results['gt_bboxes_3d'].tensor[:, :3].numpy(),
                               moved_boxes, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize('seed', [0, 1])
def test_global_rot_scale_trans_and_flip_record_the_lidar_aug_matrix(seed):
    np.random.seed(seed)
    results, pts, boxes = lidar_scene()
    pipeline = Compose([
        dict(type='BEVFusionGlobalRotScaleTrans', scale_ratio_range=[0.9, 1.1],
             rot_range=[-0.78539816, 0.78539816], translation_std=0.5),
        dict(type='BEVFusionRandomFlip3D', flip_ratio_bev_horizontal=1.0,
             flip_ratio_bev_vertical=1.0)
    ])
    out = pipeline(results)
    assert out['transformation_3d_flow'] == ['R', 'T', 'S']
    assert out['pcd_horizontal_flip'] and out['pcd_vertical_flip']
    assert_aug_matrix_maps(out, pts, boxes)


def test_random_flip_probabilities_and_errors():
    results, pts, boxes = lidar_scene()
    out = TRANSFORMS.build(dict(type='BEVFusionRandomFlip3D', flip_ratio_bev_horizontal=0,
                                flip_ratio_bev_vertical=0))(results)
    np.testing.assert_array_equal(out['lidar_aug_matrix'], np.eye(4))
    results, pts, boxes = lidar_scene()
    out = TRANSFORMS.build(dict(type='BEVFusionRandomFlip3D', flip_ratio_bev_horizontal=1,
                                flip_ratio_bev_vertical=0))(results)
    np.testing.assert_array_equal(out['lidar_aug_matrix'], np.diag([1.0, -1, 1, 1]))
    assert_aug_matrix_maps(out, pts, boxes)
    with pytest.raises(ValueError, match='flip_ratio_bev_vertical'):
        TRANSFORMS.build(dict(type='BEVFusionRandomFlip3D', flip_ratio_bev_vertical=2))


def test_grid_mask():
    imgs = [np.full((40, 60, 3), 7.0, np.float32) for _ in range(3)]
    off = TRANSFORMS.build(dict(type='GridMask', use_h=True, use_w=True, max_epoch=6,
                                prob=0.0, fixed_prob=True))
    assert all(np.array_equal(a, b) for a, b in zip(off(dict(img=imgs))['img'], imgs))
    np.random.seed(0)
    on = TRANSFORMS.build(dict(type='GridMask', use_h=True, use_w=True, max_epoch=6,
                               ratio=0.5, mode=0, prob=1.0))
    out = on(dict(img=list(imgs)))['img']
    masked = out[0][..., 0] == 0
    assert 0.05 < masked.mean() < 0.95
    assert all(np.array_equal(o[..., 0] == 0, masked) for o in out)  # one mask
    assert set(np.unique(out[0])) <= {0.0, 7.0}
    ramp = TRANSFORMS.build(dict(type='GridMask', use_h=True, use_w=True, max_epoch=6,
                                 prob=0.6, fixed_prob=False))
    ramp.set_epoch(3)
    assert ramp.prob == pytest.approx(0.3)
    with pytest.raises(ValueError, match='mode'):
        TRANSFORMS.build(dict(type='GridMask', use_h=True, use_w=True, max_epoch=1,
                              mode=2))


def camera_infos(tmp_path, sizes):
    """Image files with distinct colours and nuScenes-like calibration."""
    images = {}
    for i, (cam, (h, w)) in enumerate(zip(CAMS, sizes)):
        path = tmp_path / f'{cam}.png'
        Image.fromarray(np.full((h, w, 3), (10 * i, 100, 200), np.uint8)).save(path)
        yaw = np.deg2rad(60 * i)
        lidar2cam = np.eye(4)
        lidar2cam[:3, :3] = [[np.sin(yaw), -np.cos(yaw), 0], [0, 0, -1],
                             [np.cos(yaw), np.sin(yaw), 0]]
        lidar2cam[:3, 3] = [0.1, 0.2, -0.3 * i]
        images[cam] = dict(img_path=str(path),
                           cam2img=[[500.0, 0, w / 2], [0, 500.0, h / 2], [0, 0, 1]],
                           lidar2cam=lidar2cam.tolist())
    return images


def test_load_multiview_images_and_calibration(tmp_path):
    images = camera_infos(tmp_path, [(48, 96)] * 5 + [(40, 80)])
    load = TRANSFORMS.build(dict(type='BEVLoadMultiViewImageFromFiles', to_float32=True,
                                 color_type='color', num_views=6))
    out = load(dict(images=images))
    assert len(out['img']) == 6 and out['img'][0].dtype == np.float32
    assert all(img.shape == (48, 96, 3) for img in out['img'])  # last one padded
    assert out['img'][5][45, 90].tolist() == [0.0, 0.0, 0.0]
    assert out['img'][2][0, 0].tolist() == [20.0, 100.0, 200.0]  # RGB order
    for key in ('cam2img', 'lidar2cam', 'cam2lidar', 'lidar2img', 'ori_cam2img'):
        assert out[key].shape == (6, 4, 4), key
    for i in range(6):
        np.testing.assert_allclose(out['cam2lidar'][i] @ out['lidar2cam'][i], np.eye(4),
                                   atol=1e-6)
        np.testing.assert_allclose(out['lidar2img'][i],
                                   out['cam2img'][i] @ out['lidar2cam'][i], atol=1e-6)
    assert out['img_path'] == [images[c]['img_path'] for c in CAMS]
    assert out['ori_shape'] == (48, 96) and out['num_views'] == 6


def test_load_multiview_errors(tmp_path):
    with pytest.raises(ValueError, match='num_ref_frames'):
        TRANSFORMS.build(dict(type='BEVLoadMultiViewImageFromFiles', num_ref_frames=2))
    load = TRANSFORMS.build(dict(type='BEVLoadMultiViewImageFromFiles'))
    with pytest.raises(KeyError, match='use_camera'):
        load(dict(points=None))


def test_pipeline_packs_the_matrices_that_undo_the_augmentation(tmp_path):
    """Through the full augmentation pipeline and Pack3DDetInputs, lidar_aug_matrix
    maps the loaded points to the packed ones and one img_aug_matrix per camera is in
    the metainfo (the view transform's inputs)."""
    np.random.seed(3)
    images = camera_infos(tmp_path, [(128, 352)] * 6)
    results, pts, boxes = lidar_scene(n_points=200, seed=1)
    results['images'] = images
    pipeline = Compose([
        dict(type='BEVLoadMultiViewImageFromFiles', to_float32=True, num_views=6),
        dict(type='ImageAug3D', final_dim=[64, 176], resize_lim=[0.55, 0.65],
             bot_pct_lim=[0.0, 0.0], rot_lim=[-5.4, 5.4], rand_flip=True, is_train=True),
        dict(type='BEVFusionGlobalRotScaleTrans', scale_ratio_range=[0.9, 1.1],
             rot_range=[-0.78539816, 0.78539816], translation_std=0.5),
        dict(type='BEVFusionRandomFlip3D'),
        dict(type='GridMask', use_h=True, use_w=True, max_epoch=6, prob=0.0,
             fixed_prob=True),
        dict(type='Pack3DDetInputs', keys=['points', 'img', 'gt_bboxes_3d', 'gt_labels_3d'],
             meta_keys=['lidar2img', 'cam2img', 'cam2lidar', 'img_aug_matrix',
                        'lidar_aug_matrix'])
    ])
    packed = pipeline(results)
    meta = packed['data_samples'].metainfo
    assert packed['inputs']['img'].shape == (6, 3, 64, 176)
    assert len(meta['img_aug_matrix']) == 6 and meta['lidar2img'].shape == (6, 4, 4)
    assert all(not np.allclose(m, np.eye(4)) for m in meta['img_aug_matrix'])
    aug_pts = packed['inputs']['points'][:, :3].numpy().astype(np.float64)
    undone = (np.linalg.inv(np.asarray(meta['lidar_aug_matrix'])) @
              homogeneous(aug_pts).T).T
    # PointShuffle is not in this pipeline, so the order is kept.
    np.testing.assert_allclose(undone[:, :3], pts, atol=1e-3)
