"""Camera JPEGs decoded by the data preprocessor (``decode='gpu'``) against the PIL path
(``decode='cpu'``), on real JPEG files written by the synthetic nuScenes generator.

The device path runs here on the CPU device. Its decoder on this machine is PIL (the
CPU torch has no matching torchvision), so decoded pixels are the PIL path's and any
difference comes from the device-side geometry: the crop / flip / rotate is PIL's own
arithmetic (exact, checked without resizing), the antialiased bicubic resize is
PyTorch's, which rounds differently from Pillow's fixed point in a few pixels. Measured
on these files: at most 2 levels (of 0-255), in 0.03-0.15 % of the values, mean below
0.002; the tolerance below allows 2 levels in 0.5 % of the values. A shift of the
geometry by one pixel changes tens of percent of them.
"""
import os.path as osp

import cv2
import numpy as np
import pytest
import torch
from PIL import Image

import mmdet3d_scaling  # noqa: F401  (registers the transforms)
from mmdet3d.registry import MODELS, TRANSFORMS
from mmdet3d_scaling.datasets.transforms.deferred_images import (CameraAug,
                                                                 DeferredImages,
                                                                 augment_like_pil,
                                                                 is_packet)
from mmengine.registry import init_default_scope

CAMS = ('CAM_FRONT', 'CAM_FRONT_RIGHT', 'CAM_FRONT_LEFT', 'CAM_BACK', 'CAM_BACK_LEFT',
        'CAM_BACK_RIGHT')
DATA_PREFIX = dict(pts='samples/LIDAR_TOP', sweeps='sweeps/LIDAR_TOP',
                   **{cam: f'samples/{cam}' for cam in CAMS})
OFFICIAL_TRAIN = dict(final_dim=[256, 704], resize_lim=[0.38, 0.55],
                      bot_pct_lim=[0.0, 0.0], rot_lim=[-5.4, 5.4], rand_flip=True,
                      is_train=True)
OFFICIAL_TEST = dict(final_dim=[256, 704], resize_lim=[0.48, 0.48],
                     bot_pct_lim=[0.0, 0.0], rot_lim=[0.0, 0.0], rand_flip=False,
                     is_train=False)
SMOKE_TRAIN = dict(final_dim=[64, 192], resize_lim=[0.28, 0.31], bot_pct_lim=[0.0, 0.1],
                   rot_lim=[-5.4, 5.4], rand_flip=True, is_train=True)
GRID = dict(type='GridMask', use_h=True, use_w=True, max_epoch=6, rotate=1, offset=True,
            ratio=0.5, mode=1, prob=1.0, fixed_prob=True)
MAX_LEVELS, MAX_SHARE = 2.0, 0.005


@pytest.fixture(autouse=True)
def mmdet3d_scope():
    init_default_scope('mmdet3d')


@pytest.fixture(scope='module')
def full_res(tmp_path_factory):
    """Two full-resolution (1600 x 900) frames: 12 real JPEGs, cv2 quality 92."""
    from mmdet3d_scaling.datasets.synthetic.nuscenes import (NuScenesSyntheticConfig,
                                                             generate_nuscenes)
    out = str(tmp_path_factory.mktemp('nus_full_res'))
    generate_nuscenes(NuScenesSyntheticConfig(
        out_dir=out, train_frames=2, val_frames=1, samples_per_scene=2, sweeps=1,
        image_size=(900, 1600), objects_per_sample=10), progress=False)
    return out + '/'


def _dataset(root, steps):
    from mmdet3d.datasets import NuScenesDataset
    return NuScenesDataset(data_root=root, ann_file='nuscenes_infos_train.pkl',
                           data_prefix=DATA_PREFIX, pipeline=list(steps), test_mode=True,
                           modality=dict(use_lidar=True, use_camera=True))


def _loader(decode):
    return dict(type='BEVLoadMultiViewImageFromFiles', to_float32=True,
                color_type='color', num_views=6, decode=decode)


def _both(root, steps, index, seed):
    """The PIL path's sample and the deferred one, with the same random draws."""
    out = []
    for decode in ('cpu', 'gpu'):
        np.random.seed(seed)
        out.append(_dataset(root, [_loader(decode), *steps])[index])
    return out


def _device_images(results):
    pre = MODELS.build(dict(type='BEVFusionDataPreprocessor'))
    packet = torch.from_numpy(results['img']).permute(2, 0, 1)  # as Pack3DDetInputs
    return pre.decode_deferred([packet])[0].permute(0, 2, 3, 1).numpy()


def _assert_close(got, ref):
    assert got.shape == ref.shape and got.dtype == np.float32
    diff = np.abs(got - ref)
    share = (diff > 0).mean()
    assert diff.max() <= MAX_LEVELS and share <= MAX_SHARE, (diff.max(), share)


@pytest.mark.parametrize('aug, grid', [(OFFICIAL_TRAIN, True), (SMOKE_TRAIN, True),
                                       (OFFICIAL_TEST, False)],
                         ids=['official-train', 'smoke-train', 'official-test'])
@pytest.mark.parametrize('seed', [0, 1])
def test_device_images_match_pil_path(full_res, aug, grid, seed):
    steps = [dict(type='ImageAug3D', **aug)] + ([GRID] if grid else [])
    ref, deferred = _both(full_res, steps, index=seed % 2, seed=seed)
    assert is_packet(deferred['img'])
    assert len(ref['img_aug_matrix']) == len(deferred['img_aug_matrix']) == 6
    for a, b in zip(ref['img_aug_matrix'], deferred['img_aug_matrix']):
        assert np.array_equal(a, b)
    for key in ('img_shape', 'ori_shape', 'pad_shape', 'img_path'):
        assert tuple(ref[key]) == tuple(deferred[key]), key
    for key in ('cam2img', 'lidar2cam', 'lidar2img', 'cam2lidar'):
        assert np.array_equal(ref[key], deferred[key]), key
    _assert_close(_device_images(deferred), np.stack(ref['img']))


def test_geometry_is_exact_without_resizing(full_res):
    """Resize factor 1: crop, flip and rotation must be PIL's pixel for pixel."""
    aug = dict(final_dim=[640, 1408], resize_lim=[1.0, 1.0], bot_pct_lim=[0.0, 0.2],
               rot_lim=[-20.0, 20.0], rand_flip=True, is_train=True)
    ref, deferred = _both(full_res, [dict(type='ImageAug3D', **aug)], index=0, seed=3)
    flips = DeferredImages.from_array(deferred['img']).aug
    assert any(a.flip for a in flips) and not all(a.flip for a in flips)
    np.testing.assert_array_equal(_device_images(deferred), np.stack(ref['img']))


@pytest.mark.parametrize('size', [(37, 64), (48, 48)])
def test_rotation_is_pils_for_any_angle(size):
    rng = np.random.default_rng(0)
    h, w = size
    img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    angles = [0.0, 90.0, 180.0, 270.0, -90.0, 360.0, 0.3, -7.25, 45.0, 133.7, 359.99]
    for angle in angles:
        for flip in (False, True):
            pil = Image.fromarray(img)
            if flip:
                pil = pil.transpose(Image.FLIP_LEFT_RIGHT)
            ref = np.asarray(pil.rotate(angle))
            aug = CameraAug(1.0, (w, h), (0, 0, w, h), flip, angle)
            chw = torch.from_numpy(img).permute(2, 0, 1)
            got = augment_like_pil([chw], [aug], (h, w))
            np.testing.assert_array_equal(got[0].permute(1, 2, 0).numpy(), ref,
                                          err_msg=f'angle {angle}, flip {flip}')


def test_crop_outside_the_image_is_zero_as_pil():
    img = np.full((20, 30, 3), 200, np.uint8)
    crop = (-5, -3, 35, 22)  # larger than the image on every side
    ref = np.asarray(Image.fromarray(img).crop(crop).rotate(3.0))
    aug = CameraAug(1.0, (30, 20), crop, False, 3.0)
    got = augment_like_pil([torch.from_numpy(img).permute(2, 0, 1)], [aug], (25, 40))
    np.testing.assert_array_equal(got[0].permute(1, 2, 0).numpy(), ref)


def test_images_of_different_sizes_are_zero_padded_as_pil_path(tmp_path):
    rng = np.random.default_rng(1)
    sizes, images = [(90, 160), (120, 140), (60, 200)], {}
    for i, (h, w) in enumerate(sizes):
        path = str(tmp_path / f'cam{i}.jpg')
        cv2.imwrite(path, rng.integers(0, 256, (h, w, 3), dtype=np.uint8),
                    [cv2.IMWRITE_JPEG_QUALITY, 92])
        images[f'CAM_{i}'] = dict(img_path=path, cam2img=np.eye(3).tolist(),
                                  lidar2cam=np.eye(4).tolist())
    out = {}
    for decode in ('cpu', 'gpu'):
        loader = TRANSFORMS.build(dict(_loader(decode), num_views=3))
        out[decode] = loader(dict(images=images))
    assert out['gpu']['img_shape'] == out['cpu']['img_shape'] == (120, 200)
    np.testing.assert_array_equal(_device_images(out['gpu']), np.stack(out['cpu']['img']))


def test_packet_goes_through_stock_pack3ddetinputs(full_res):
    steps = [dict(type='ImageAug3D', **OFFICIAL_TEST),
             dict(type='Pack3DDetInputs', keys=['img', 'points'],
                  meta_keys=['img_aug_matrix', 'lidar2img', 'img_path'])]
    packed = _dataset(full_res, [_loader('gpu'), *steps])[0]
    img = packed['inputs']['img']
    assert isinstance(img, torch.Tensor) and img.dtype == torch.uint8 and is_packet(img)
    assert len(packed['data_samples'].metainfo['img_aug_matrix']) == 6


def test_non_jpeg_file_is_named(tmp_path):
    png = str(tmp_path / 'front.png')
    cv2.imwrite(png, np.zeros((16, 16, 3), np.uint8))
    loader = TRANSFORMS.build(dict(_loader('gpu'), num_views=1))
    results = dict(images=dict(CAM_FRONT=dict(img_path=png, cam2img=np.eye(3).tolist(),
                                              lidar2cam=np.eye(4).tolist())))
    with pytest.raises(ValueError, match=r"front\.png is PNG.*decode='cpu'"):
        loader(results)
    assert TRANSFORMS.build(dict(_loader('cpu'), num_views=1))(results)['img'][0].shape \
        == (16, 16, 3)


@pytest.mark.parametrize('cfg, match', [
    (dict(decode='nvjpeg'), r"decode='nvjpeg'"),
    (dict(decode='gpu', color_type='grayscale'), "color_type='color'"),
])
def test_bad_options_say_what_to_use(cfg, match):
    with pytest.raises(ValueError, match=match):
        TRANSFORMS.build(dict(_loader('cpu'), **cfg))


def test_cpu_mode_is_unchanged(full_res):
    """decode='cpu' (the default) still hands float32 pixel arrays to ImageAug3D."""
    a = _dataset(full_res, [_loader('cpu')])[0]
    b = _dataset(full_res, [dict(type='BEVLoadMultiViewImageFromFiles', to_float32=True,
                                 color_type='color', num_views=6)])[0]
    assert all(np.array_equal(x, y) for x, y in zip(a['img'], b['img']))
    assert a['img'][0].shape == (900, 1600, 3) and osp.isfile(a['img_path'][0])
