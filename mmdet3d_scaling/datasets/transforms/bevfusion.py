"""Data transforms of BEVFusion (mmdet3d ``projects/BEVFusion`` type names).

They pass along the keys upstream's pipeline relies on: ``img_aug_matrix`` (one 4x4
per camera: resize/crop/flip/rotate applied to the image, in pixels),
``lidar_aug_matrix`` (4x4: rotation/scale/translation/flips applied to the points),
``cam2img``, ``lidar2cam``, ``cam2lidar``, ``lidar2img`` and ``ori_cam2img``.

``BEVLoadMultiViewImageFromFiles(decode='gpu')`` defers JPEG decoding to the model's
data preprocessor (see :mod:`.deferred_images`); ImageAug3D and GridMask then record
their parameters instead of touching pixels.
"""
import copy
from typing import List, Optional, Sequence, Tuple

import mmcv
import numpy as np
from mmcv.transforms import BaseTransform
from mmengine.fileio import get
from mmengine.logging import print_log
from PIL import Image

from mmdet3d.datasets.transforms import GlobalRotScaleTrans, LoadMultiViewImageFromFiles
from mmdet3d.registry import TRANSFORMS
from ...registry import register
from .deferred_images import (DECODE_MODES, CameraAug, DeferredImages,
                              deferred_from_results, jpeg_size)

_ANNOUNCED = set()  # decode modes already logged in this process


def _rigid_inverse(matrix: np.ndarray) -> np.ndarray:
    """Inverse of a 4x4 rotation + translation."""
    rot, trans = matrix[:3, :3], matrix[:3, 3]
    inv = np.eye(4)
    inv[:3, :3] = rot.T
    inv[:3, 3] = -rot.T @ trans
    return inv


@register(TRANSFORMS)
class BEVLoadMultiViewImageFromFiles(LoadMultiViewImageFromFiles):
    """Load every camera image of a sample and its calibration matrices.

    Reads ``results['images'][cam]['img_path' | 'cam2img' | 'lidar2cam']`` (the
    mmdet3d 1.x info layout), in the order of ``results['images']``. Images of
    different sizes are zero-padded to the largest. Adds ``img`` (list of ``H x W x 3``
    RGB arrays), ``img_path``, ``filename``, ``cam2img``, ``ori_cam2img``, ``lidar2cam``,
    ``cam2lidar``, ``lidar2img`` (``N x 4 x 4``), ``img_shape``, ``ori_shape``,
    ``pad_shape``, ``scale_factor``, ``img_norm_cfg``, ``num_views``.

    Args: as :class:`mmdet3d.datasets.transforms.LoadMultiViewImageFromFiles`
    (``to_float32``, ``color_type``, ``backend_args``, ``num_views``, ...), plus
        decode: where the JPEGs are decoded. ``'cpu'`` (default): here, with PIL, in
            the loader worker. ``'gpu'``: the raw bytes travel in ``img`` as a packet
            (:mod:`.deferred_images`) and BEVFusion's data preprocessor decodes them
            on the model's device (nvJPEG on CUDA); the file headers give the image
            sizes, so ``img_shape`` and the other keys are as with ``'cpu'``. Needs
            ``color_type='color'`` and JPEG files.
    Loading previous frames (``num_ref_frames > 0``) is not supported.
    """

    def __init__(self, *args, decode: str = 'cpu', **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.num_ref_frames > 0:
            raise ValueError(
                f'BEVLoadMultiViewImageFromFiles loads the current frame only; got '
                f'num_ref_frames={self.num_ref_frames}. Leave it at -1.')
        if decode not in DECODE_MODES:
            raise ValueError(f'BEVLoadMultiViewImageFromFiles: decode={decode!r}; use '
                             f"one of {DECODE_MODES} ('cpu': PIL in the loader worker, "
                             "'gpu': on the model's device).")
        if decode == 'gpu' and self.color_type != 'color':
            raise ValueError(f"BEVLoadMultiViewImageFromFiles: decode='gpu' decodes to "
                             f"RGB, so it needs color_type='color' (got "
                             f"{self.color_type!r}); use decode='cpu' for other types.")
        self.decode = decode
        if decode != 'cpu' and decode not in _ANNOUNCED:
            _ANNOUNCED.add(decode)
            print_log("BEVLoadMultiViewImageFromFiles: decode='gpu': camera JPEGs are "
                      "decoded and augmented by the data preprocessor on the model's "
                      'device, not in the loader workers.', logger='current')

    def _calibration(self, results: dict) -> None:
        paths, cam2img, lidar2cam, cam2lidar, lidar2img = [], [], [], [], []
        for cam_item in results['images'].values():
            paths.append(cam_item['img_path'])
            l2c = np.asarray(cam_item['lidar2cam'], dtype=np.float32)
            intrinsic = np.eye(4, dtype=np.float32)
            k = np.asarray(cam_item['cam2img'], dtype=np.float32)
            intrinsic[:k.shape[0], :k.shape[1]] = k
            lidar2cam.append(l2c)
            cam2lidar.append(_rigid_inverse(l2c.astype(np.float64)))
            cam2img.append(intrinsic)
            lidar2img.append(intrinsic @ l2c)
        results['img_path'] = paths
        results['cam2img'] = np.stack(cam2img)
        results['lidar2cam'] = np.stack(lidar2cam)
        results['cam2lidar'] = np.stack(cam2lidar)
        results['lidar2img'] = np.stack(lidar2img)
        results['ori_cam2img'] = copy.deepcopy(results['cam2img'])

    def _read(self, path: str) -> np.ndarray:
        data = get(path, backend_args=self.backend_args)
        return mmcv.imfrombytes(data, flag=self.color_type, backend='pillow',
                                channel_order='rgb')

    def transform(self, results: dict) -> dict:
        if not results.get('images'):
            raise KeyError('BEVLoadMultiViewImageFromFiles needs results["images"] '
                           '(camera infos); build the dataset with '
                           'modality=dict(use_camera=True).')
        self._calibration(results)
        if self.decode == 'gpu':
            return self._defer(results)
        imgs = [self._read(p) for p in results['img_path']]
        shapes = np.stack([img.shape for img in imgs])
        if not (shapes == shapes.max(0)).all():
            pad = tuple(shapes.max(0)[:2])
            imgs = [mmcv.impad(img, shape=pad, pad_val=0) for img in imgs]
        if self.to_float32:
            imgs = [img.astype(np.float32) for img in imgs]
        shape = imgs[0].shape[:2]
        results['filename'] = results['img_path']
        results['img'] = imgs
        results['img_shape'] = shape
        results['ori_shape'] = shape
        results['pad_shape'] = shape
        if self.set_default_scale:
            results['scale_factor'] = 1.0
        channels = 1 if imgs[0].ndim < 3 else imgs[0].shape[2]
        self._set_common(results, channels)
        return results

    def _set_common(self, results: dict, channels: int) -> None:
        results['img_norm_cfg'] = dict(
            mean=np.zeros(channels, dtype=np.float32),
            std=np.ones(channels, dtype=np.float32),
            to_rgb=False)
        results['num_views'] = self.num_views
        results['num_ref_frames'] = self.num_ref_frames

    def _defer(self, results: dict) -> dict:
        """Keep the JPEG bytes; sizes come from the file headers."""
        jpegs, sizes = [], []
        for path in results['img_path']:
            data = get(path, backend_args=self.backend_args)
            sizes.append(jpeg_size(data, path))
            jpegs.append(data)
        deferred = DeferredImages(paths=list(results['img_path']), sizes=sizes,
                                  jpegs=jpegs)
        shape = deferred.pad_shape
        results['filename'] = results['img_path']
        results['img'] = deferred.to_array()
        results['img_shape'] = shape
        results['ori_shape'] = shape
        results['pad_shape'] = shape
        if self.set_default_scale:
            results['scale_factor'] = 1.0
        self._set_common(results, 3)
        return results


@register(TRANSFORMS)
class ImageAug3D(BaseTransform):
    """Resize, crop, flip and rotate every camera image; record ``img_aug_matrix``.

    Each camera gets its own random draw (training). ``img_aug_matrix`` maps
    original-image pixels (u, v) to augmented-image pixels.

    Args:
        final_dim: output ``(H, W)`` in pixels.
        resize_lim: ``(min, max)`` resize factor (test: their mean).
        bot_pct_lim: ``(min, max)`` fraction cropped off the bottom.
        rot_lim: ``(min, max)`` rotation in degrees.
        rand_flip: random horizontal flip (training only).
        is_train: random draws (True) or the deterministic centre setting (False).

    With deferred images (``BEVLoadMultiViewImageFromFiles(decode='gpu')``) it makes
    the same draws and records them with ``img_aug_matrix``; the data preprocessor
    applies them on the device.
    """

    def __init__(self, final_dim: Sequence[int], resize_lim: Sequence[float],
                 bot_pct_lim: Sequence[float], rot_lim: Sequence[float],
                 rand_flip: bool, is_train: bool) -> None:
        self.final_dim = tuple(final_dim)
        self.resize_lim = resize_lim
        self.bot_pct_lim = bot_pct_lim
        self.rand_flip = rand_flip
        self.rot_lim = rot_lim
        self.is_train = is_train

    def sample_augmentation(self, results: dict) -> Tuple:
        """``(resize, (newW, newH), crop box, flip, rotate degrees)``."""
        H, W = results['ori_shape']
        fH, fW = self.final_dim
        if self.is_train:
            resize = np.random.uniform(*self.resize_lim)
            newW, newH = int(W * resize), int(H * resize)
            crop_h = int((1 - np.random.uniform(*self.bot_pct_lim)) * newH) - fH
            crop_w = int(np.random.uniform(0, max(0, newW - fW)))
            flip = bool(self.rand_flip and np.random.choice([0, 1]))
            rotate = np.random.uniform(*self.rot_lim)
        else:
            resize = np.mean(self.resize_lim)
            newW, newH = int(W * resize), int(H * resize)
            crop_h = int((1 - np.mean(self.bot_pct_lim)) * newH) - fH
            crop_w = int(max(0, newW - fW) / 2)
            flip, rotate = False, 0
        crop = (crop_w, crop_h, crop_w + fW, crop_h + fH)
        return resize, (newW, newH), crop, flip, rotate

    @staticmethod
    def aug_matrix(resize: float, crop: Tuple[int, int, int, int], flip: bool,
                   rotate: float) -> np.ndarray:
        """4x4 pixel transform of resize -> crop -> flip -> rotate about the centre."""
        rot = np.eye(2) * resize
        trans = -np.asarray(crop[:2], dtype=np.float64)
        width, height = crop[2] - crop[0], crop[3] - crop[1]
        if flip:
            a = np.array([[-1.0, 0.0], [0.0, 1.0]])
            rot, trans = a @ rot, a @ trans + np.array([width, 0.0])
        theta = rotate / 180 * np.pi
        a = np.array([[np.cos(theta), np.sin(theta)], [-np.sin(theta), np.cos(theta)]])
        centre = np.array([width, height]) / 2
        rot, trans = a @ rot, a @ trans + (a @ -centre + centre)
        matrix = np.eye(4, dtype=np.float32)
        matrix[:2, :2] = rot
        matrix[:2, 3] = trans
        return matrix

    def transform(self, results: dict) -> dict:
        deferred = deferred_from_results(results)
        if deferred is not None:
            return self._record(results, deferred)
        new_imgs, matrices = [], []
        for img in results['img']:
            resize, dims, crop, flip, rotate = self.sample_augmentation(results)
            pil = Image.fromarray(img.astype('uint8'), mode='RGB')
            pil = pil.resize(dims).crop(crop)
            if flip:
                pil = pil.transpose(method=Image.FLIP_LEFT_RIGHT)
            pil = pil.rotate(rotate)
            new_imgs.append(np.array(pil).astype(np.float32))
            matrices.append(self.aug_matrix(resize, crop, flip, rotate))
        results['img'] = new_imgs
        results['img_aug_matrix'] = matrices
        results['img_shape'] = self.final_dim
        return results

    def _record(self, results: dict, deferred: DeferredImages) -> dict:
        """Draw per camera in the order of the PIL path; record, touch no pixel."""
        if deferred.aug is not None:
            raise ValueError("ImageAug3D ran twice on deferred images (decode='gpu'); "
                             "the device path applies one ImageAug3D. Use decode='cpu'.")
        draws = [self.sample_augmentation(results) for _ in deferred.jpegs]
        deferred.aug = [CameraAug(float(resize), tuple(int(d) for d in dims),
                                  tuple(int(c) for c in crop), bool(flip), float(rotate))
                        for resize, dims, crop, flip, rotate in draws]
        deferred.final_dim = self.final_dim
        results['img'] = deferred.to_array()
        results['img_aug_matrix'] = [self.aug_matrix(resize, crop, flip, rotate)
                                     for resize, _, crop, flip, rotate in draws]
        results['img_shape'] = self.final_dim
        return results


@register(TRANSFORMS)
class BEVFusionRandomFlip3D(BaseTransform):
    """Random BEV flips of points, boxes and BEV masks; updates ``lidar_aug_matrix``.

    Horizontal flips negate y, vertical flips negate x; each is drawn independently.

    Args:
        flip_ratio_bev_horizontal: probability of the horizontal flip. Default 0.5.
        flip_ratio_bev_vertical: probability of the vertical flip. Default 0.5.
    """

    def __init__(self, flip_ratio_bev_horizontal: float = 0.5,
                 flip_ratio_bev_vertical: float = 0.5) -> None:
        for name, ratio in (('flip_ratio_bev_horizontal', flip_ratio_bev_horizontal),
                            ('flip_ratio_bev_vertical', flip_ratio_bev_vertical)):
            if not 0 <= ratio <= 1:
                raise ValueError(f'{name} must be a probability in [0, 1], got {ratio}.')
        self.flip_ratio_bev_horizontal = flip_ratio_bev_horizontal
        self.flip_ratio_bev_vertical = flip_ratio_bev_vertical

    @staticmethod
    def _flip(data: dict, direction: str, mask_axis: int) -> None:
        if 'points' in data:
            data['points'].flip(direction)
        if 'gt_bboxes_3d' in data:
            data['gt_bboxes_3d'].flip(direction)
        if 'gt_masks_bev' in data:
            data['gt_masks_bev'] = np.flip(data['gt_masks_bev'], mask_axis).copy()

    def transform(self, data: dict) -> dict:
        horizontal = np.random.rand() < self.flip_ratio_bev_horizontal
        vertical = np.random.rand() < self.flip_ratio_bev_vertical
        rotation = np.eye(3)
        if horizontal:
            rotation = np.diag([1.0, -1.0, 1.0]) @ rotation
            self._flip(data, 'horizontal', 2)
        if vertical:
            rotation = np.diag([-1.0, 1.0, 1.0]) @ rotation
            self._flip(data, 'vertical', 1)
        data['pcd_horizontal_flip'] = bool(horizontal)
        data['pcd_vertical_flip'] = bool(vertical)
        aug = np.asarray(data.get('lidar_aug_matrix', np.eye(4)), dtype=np.float64)
        aug = aug.copy()
        aug[:3, :] = rotation @ aug[:3, :]
        data['lidar_aug_matrix'] = aug
        return data


@register(TRANSFORMS)
class BEVFusionGlobalRotScaleTrans(GlobalRotScaleTrans):
    """GlobalRotScaleTrans in the order rotate, translate, scale; updates
    ``lidar_aug_matrix`` (points_new = lidar_aug_matrix @ points).

    Args: as :class:`mmdet3d.datasets.transforms.GlobalRotScaleTrans`
    (``rot_range`` radians, ``scale_ratio_range``, ``translation_std`` metres).
    """

    def transform(self, input_dict: dict) -> dict:
        input_dict.setdefault('transformation_3d_flow', [])
        self._rot_bbox_points(input_dict)
        if 'pcd_scale_factor' not in input_dict:
            self._random_scale(input_dict)
        self._trans_bbox_points(input_dict)
        self._scale_bbox_points(input_dict)
        input_dict['transformation_3d_flow'].extend(['R', 'T', 'S'])
        scale = float(input_dict['pcd_scale_factor'])
        rot_t = np.asarray(input_dict['pcd_rotation'], dtype=np.float64)
        augs = np.eye(4)
        augs[:3, :3] = rot_t.T * scale
        augs[:3, 3] = np.asarray(input_dict['pcd_trans'], dtype=np.float64) * scale
        previous = np.asarray(input_dict.get('lidar_aug_matrix', np.eye(4)))
        input_dict['lidar_aug_matrix'] = augs @ previous
        return input_dict


@register(TRANSFORMS)
class GridMask(BaseTransform):
    """GridMask image augmentation applied with probability ``prob`` to all cameras.

    Args:
        use_h: mask horizontal stripes. use_w: mask vertical stripes.
        max_epoch: epochs over which ``prob`` ramps up (``fixed_prob=False``).
        rotate: the mask is rotated by ``randint(rotate)`` degrees. Default 1 (none).
        offset: fill masked pixels with noise in [-1, 1]. Default False.
        ratio: stripe width / period. Default 0.5.
        mode: 0 masks the stripes, 1 keeps only the stripes. Default 0.
        prob: probability of applying the mask. Default 1.0.
        fixed_prob: keep ``prob`` fixed instead of ramping with the epoch.

    With deferred images (``decode='gpu'``) the mask is drawn here as usual and
    applied by the data preprocessor after decoding and augmentation.
    """

    def __init__(self, use_h: bool, use_w: bool, max_epoch: int, rotate: int = 1,
                 offset: bool = False, ratio: float = 0.5, mode: int = 0,
                 prob: float = 1.0, fixed_prob: bool = False) -> None:
        if mode not in (0, 1):
            raise ValueError(f'GridMask mode must be 0 or 1, got {mode}.')
        self.use_h, self.use_w = use_h, use_w
        self.rotate, self.offset = rotate, offset
        self.ratio, self.mode = ratio, mode
        self.st_prob = self.prob = prob
        self.epoch: Optional[int] = None
        self.max_epoch = max_epoch
        self.fixed_prob = fixed_prob

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if not self.fixed_prob:
            self.set_prob(epoch, self.max_epoch)

    def set_prob(self, epoch: int, max_epoch: int) -> None:
        self.prob = self.st_prob * epoch / max_epoch

    def _mask(self, h: int, w: int) -> np.ndarray:
        hh, ww = int(1.5 * h), int(1.5 * w)
        d = np.random.randint(2, min(h, w))
        if self.ratio == 1:
            length = np.random.randint(1, d)
        else:
            length = min(max(int(d * self.ratio + 0.5), 1), d - 1)
        mask = np.ones((hh, ww), np.float32)
        st_h, st_w = np.random.randint(d), np.random.randint(d)
        if self.use_h:
            for i in range(hh // d):
                s = d * i + st_h
                mask[s:min(s + length, hh), :] = 0
        if self.use_w:
            for i in range(ww // d):
                s = d * i + st_w
                mask[:, s:min(s + length, ww)] = 0
        angle = np.random.randint(self.rotate)
        mask = np.asarray(Image.fromarray(np.uint8(mask)).rotate(angle))
        mask = mask[(hh - h) // 2:(hh - h) // 2 + h, (ww - w) // 2:(ww - w) // 2 + w]
        mask = mask.astype(np.float32)[:, :, None]
        return 1 - mask if self.mode == 1 else mask

    def transform(self, results: dict) -> dict:
        if np.random.rand() > self.prob:
            return results
        deferred = deferred_from_results(results)
        if deferred is not None:
            h, w = deferred.shape
        else:
            imgs: List[np.ndarray] = results['img']
            h, w = imgs[0].shape[:2]
        mask = self._mask(h, w)
        if deferred is not None:
            offset = None
            if self.offset:
                noise = (2 * (np.random.rand(h, w) - 0.5)).astype(np.float32)
                offset = (1 - mask[..., 0]) * noise
            deferred.masks.append((mask[..., 0], offset))
            results['img'] = deferred.to_array()
            return results
        if self.offset:
            noise = (2 * (np.random.rand(h, w) - 0.5)).astype(np.float32)[:, :, None]
            offset = (1 - mask) * noise
            results['img'] = [x * mask + offset for x in imgs]
        else:
            results['img'] = [x * mask for x in imgs]
        return results
