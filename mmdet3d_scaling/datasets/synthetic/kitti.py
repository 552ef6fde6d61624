"""Write a synthetic dataset in the layout that mmdet3d 1.4's ``KittiDataset`` reads.

::

    OUT/
      ImageSets/{train,val,trainval}.txt
      training/velodyne/000000.bin          float32 x, y, z, intensity (full scan)
      training/velodyne_reduced/000000.bin  the points inside the camera image
      training/image_2/000000.png           375 x 1242, consistent with calib P2
      training/calib/000000.txt             P0-P3, R0_rect, Tr_velo_to_cam, Tr_imu_to_velo
      training/label_2/000000.txt           KITTI label lines (camera frame)
      training/planes/000000.txt            ground plane (camera frame)
      kitti_infos_{train,val,trainval}.pkl  mmdet3d v2 infos (info_version 1.1)
      kitti_gt_database/*.bin               object points for ObjectSample (train)
      kitti_dbinfos_train.pkl

Frame ``i`` is drawn from ``np.random.default_rng([seed, i])`` alone, so the same seed
gives the same bytes, and growing ``--val-frames`` never changes the training frames.
Frames are written one at a time (memory does not grow with the frame count, apart
from the small info dicts).
"""
import os
import os.path as osp
import time
import pickle
from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np

from . import exact
from .camera import box_to_2d, in_image_mask, render_image
from .scene import KITTI_CLASSES, Area, Scene, SensorModel, points_in_box_mask, sample_scene
from ...utils.atomic_io import atomic_writer
from .target import check_target, mark_complete, write_marker

__all__ = ['KittiSceneConfig', 'KittiCalib', 'write_kitti', 'KITTI_V2_CLASSES']

#: the category list of mmdet3d's KITTI v2 infos (labels index it)
KITTI_V2_CLASSES = ('Pedestrian', 'Cyclist', 'Car', 'Van', 'Truck', 'Person_sitting',
                    'Tram', 'Misc')
_CLASS_BGR = {'Car': (40, 40, 200), 'Pedestrian': (200, 60, 40), 'Cyclist': (40, 190, 220)}


@dataclass(frozen=True)
class KittiSceneConfig:
    """What a synthetic KITTI frame contains.

    Args:
        area: where objects and clutter go (LiDAR frame, metres). Defaults to 4-40 m
            ahead, +-20 m to the sides: inside both the stock KITTI point-cloud range
            and the CPU demo's smaller one, so every labelled object is detectable.
        objects: (min, max) objects per frame, inclusive. Defaults to (6, 14).
        clutter: (min, max) poles/walls/bushes per frame, inclusive. Defaults to (4, 10).
        fov_deg: objects stay within this horizontal angle around the camera axis
            (KITTI's camera sees about 80 degrees). Defaults to 76.
        sensor: the LiDAR model (see :class:`SensorModel`).
    """
    area: Area = Area(x_min=4.0, y_min=-20.0, x_max=40.0, y_max=20.0, min_range=5.0)
    objects: Tuple[int, int] = (6, 14)
    clutter: Tuple[int, int] = (4, 10)
    fov_deg: float = 76.0
    sensor: SensorModel = SensorModel()


@dataclass(frozen=True)
class KittiCalib:
    """A fixed KITTI-like calibration (velodyne -> rectified camera -> image)."""
    height: int = 375
    width: int = 1242
    focal: float = 721.5377
    cx: float = 609.5593
    cy: float = 172.854

    def P(self, cam: int) -> np.ndarray:
        """3x4 projection matrix of camera ``cam`` (0-3; KITTI's baseline offsets)."""
        offsets = {0: (0.0, 0.0, 0.0), 1: (-387.5744, 0.0, 0.0),
                   2: (44.85728, 0.2163791, 0.002745884), 3: (-339.5242, 2.199936, 0.002729905)}
        p = np.array([[self.focal, 0, self.cx, 0], [0, self.focal, self.cy, 0], [0, 0, 1, 0]])
        p[:, 3] = offsets[cam]
        return p

    @property
    def R0_rect(self) -> np.ndarray:
        return np.eye(3)

    @property
    def Tr_velo_to_cam(self) -> np.ndarray:
        # x forward / y left / z up  ->  x right / y down / z forward, then offset
        return np.array([[0.0, -1.0, 0.0, -0.0041], [0.0, 0.0, -1.0, -0.0763],
                         [1.0, 0.0, 0.0, -0.2719]])

    @property
    def Tr_imu_to_velo(self) -> np.ndarray:
        return np.array([[1.0, 0.0, 0.0, -0.8087], [0.0, 1.0, 0.0, 0.3196],
                         [0.0, 0.0, 1.0, -0.7997]])

    @property
    def lidar2cam(self) -> np.ndarray:
        """4x4 LiDAR -> rectified CAM (R0_rect @ Tr_velo_to_cam)."""
        return exact.matmul(_hom(self.R0_rect), _hom(self.Tr_velo_to_cam))

    def lidar2img(self, cam: int = 2) -> np.ndarray:
        return exact.matmul(_hom(self.P(cam)), self.lidar2cam)

    def text(self) -> str:
        """The calib/*.txt content."""
        rows = [(f'P{i}', self.P(i)) for i in range(4)] + [
            ('R0_rect', self.R0_rect), ('Tr_velo_to_cam', self.Tr_velo_to_cam),
            ('Tr_imu_to_velo', self.Tr_imu_to_velo)]
        return ''.join(f'{k}: ' + ' '.join(f'{v:.12e}' for v in m.ravel()) + '\n'
                       for k, m in rows)


def _hom(m: np.ndarray) -> np.ndarray:
    """3x3 or 3x4 -> 4x4 homogeneous."""
    out = np.eye(4)
    out[:m.shape[0], :m.shape[1]] = m
    return out


def _lidar_box_to_cam(box: np.ndarray, lidar2cam: np.ndarray) -> np.ndarray:
    """(x, y, z_bottom, l, w, h, yaw) LiDAR -> KITTI camera (x, y, z, l, h, w, ry).

    Same convention as mmdet3d's ``Box3DMode.convert`` (LIDAR -> CAM).
    """
    loc = exact.matmul(lidar2cam, np.array([box[0], box[1], box[2], 1.0]))[:3]
    ry = -float(box[6]) - np.pi / 2
    ry = ry - np.floor(ry / (2 * np.pi) + 0.5) * 2 * np.pi  # [-pi, pi)
    return np.array([*loc, box[3], box[5], box[4], ry])


def _occlusion_level(visibility: float) -> int:
    """KITTI's occluded flag from the share of surface points the sensor sees."""
    return 0 if visibility >= 0.8 else (1 if visibility >= 0.4 else 2)


def _difficulty(height: float, occluded: int, truncated: float) -> int:
    """KITTI difficulty (0 easy, 1 moderate, 2 hard, -1 none), as mmdet3d computes it."""
    for level, (min_h, max_occ, max_trunc) in enumerate(
            ((40, 0, 0.15), (25, 1, 0.3), (25, 2, 0.5))):
        if height > min_h and occluded <= max_occ and truncated <= max_trunc:
            return level
    return -1


def _label_line(name: str, inst: dict) -> str:
    x, y, z, l, h, w, ry = inst['bbox_3d']
    return (f"{name} {inst['truncated']:.2f} {inst['occluded']} {inst['alpha']:.2f} "
            + ' '.join(f'{v:.2f}' for v in inst['bbox'])
            + f' {h:.2f} {w:.2f} {l:.2f} {x:.2f} {y:.2f} {z:.2f} {ry:.2f}\n')


def _instances(scene: Scene, reduced: np.ndarray, calib: KittiCalib) -> List[dict]:
    """v2 ``instances`` of the labelled objects: in the image and hit by >= 1 point."""
    lidar2cam, P2 = calib.lidar2cam, _hom(calib.P(2))
    hw = (calib.height, calib.width)
    out = []
    for i, (box, label) in enumerate(zip(scene.boxes_lidar.astype(np.float64), scene.labels)):
        proj = box_to_2d(box, calib.lidar2img(2), hw)
        n_pts = int(points_in_box_mask(reduced[:, :3], box).sum())
        if proj is None or n_pts == 0:
            continue
        bbox, truncated = proj
        name = scene.class_names[label]
        cam = _lidar_box_to_cam(box, lidar2cam)
        gravity = cam[:3] - np.array([0, cam[4] / 2, 0])  # bottom -> gravity centre
        uvd = exact.matmul(P2, np.append(gravity, 1.0))
        occluded = _occlusion_level(float(scene.visibility[i]))
        truncated = round(truncated, 2)
        out.append(dict(
            bbox=bbox.tolist(),
            bbox_label=KITTI_V2_CLASSES.index(name),
            bbox_3d=cam.tolist(),
            bbox_label_3d=KITTI_V2_CLASSES.index(name),
            depth=float(uvd[2]),
            center_2d=(uvd[:2] / uvd[2]).tolist(),
            num_lidar_pts=n_pts,
            difficulty=_difficulty(bbox[3] - bbox[1], occluded, truncated),
            truncated=truncated,
            occluded=occluded,
            alpha=float(-exact.arctan2(cam[0], cam[2]) + cam[6]),
            score=0.0,
            index=len(out),
            group_id=len(out),
            _lidar_box=box, _name=name))
    return out


def _cam_instances(instances: List[dict]) -> List[dict]:
    """``cam_instances['CAM2']``: the mono-3D view of the same objects."""
    keys = ('bbox', 'bbox_label', 'bbox_3d', 'bbox_label_3d', 'center_2d', 'depth')
    return [dict({k: inst[k] for k in keys}, velocity=-1) for inst in instances]


def _ground_plane(calib: KittiCalib, ground_z: float) -> List[float]:
    """KITTI plane (normal, offset) in the camera frame: normal . p + offset = 0."""
    normal = exact.matmul(calib.lidar2cam[:3, :3], np.array([0.0, 0.0, 1.0]))
    point = exact.matmul(calib.lidar2cam, np.array([0.0, 0.0, ground_z, 1.0]))[:3]
    return [*normal.tolist(), float(-exact.dot(normal, point))]


def _frame_info(idx: int, instances: List[dict], calib: KittiCalib, n_feats: int,
                plane: List[float]) -> dict:
    name = f'{idx:06d}'
    images = {f'CAM{c}': dict(cam2img=_hom(calib.P(c)).tolist(),
                              lidar2img=calib.lidar2img(c).tolist()) for c in range(4)}
    images['CAM2'].update(img_path=f'{name}.png', height=calib.height, width=calib.width,
                          lidar2cam=calib.lidar2cam.tolist())
    images['R0_rect'] = _hom(calib.R0_rect).tolist()
    public = [{k: v for k, v in inst.items() if not k.startswith('_')} for inst in instances]
    return dict(
        sample_idx=idx,
        images=images,
        lidar_points=dict(num_pts_feats=n_feats, lidar_path=f'{name}.bin',
                          Tr_velo_to_cam=_hom(calib.Tr_velo_to_cam).tolist(),
                          Tr_imu_to_velo=_hom(calib.Tr_imu_to_velo).tolist()),
        instances=public,
        cam_instances=dict(CAM2=_cam_instances(public)),
        plane=plane)


class _GtDatabase:
    """Collects ``kitti_gt_database/*.bin`` and the db infos that ObjectSample reads."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.infos: Dict[str, List[dict]] = {}
        self.group = 0
        os.makedirs(osp.join(root, 'kitti_gt_database'), exist_ok=True)

    def add(self, idx: int, points: np.ndarray, instances: List[dict]) -> None:
        for i, inst in enumerate(instances):
            box, name = inst['_lidar_box'], inst['_name']
            obj = points[points_in_box_mask(points[:, :3], box)].copy()
            obj[:, :3] -= box[:3]  # relative to the bottom centre, as mmdet3d stores them
            rel = osp.join('kitti_gt_database', f'{idx}_{name}_{i}.bin')
            obj.astype(np.float32).tofile(osp.join(self.root, rel))
            self.infos.setdefault(name, []).append(dict(
                name=name, path=rel, image_idx=idx, gt_idx=i,
                box3d_lidar=box.astype(np.float32), num_points_in_gt=len(obj),
                difficulty=inst['difficulty'], group_id=self.group, score=0.0))
            self.group += 1


def _dump(obj: object, path: str) -> None:
    """Pickle ``obj`` to ``path`` atomically: a reader sees the old file or the new."""
    with atomic_writer(path) as f:
        pickle.dump(obj, f, protocol=4)


def _metainfo() -> dict:
    return dict(categories={k: i for i, k in enumerate(KITTI_V2_CLASSES)},
                dataset='kitti', info_version='1.1')


def write_frame(root: str, idx: int, seed: int, cfg: KittiSceneConfig,
                calib: KittiCalib) -> Tuple[dict, np.ndarray, List[dict]]:
    """Sample frame ``idx`` and write its files; returns (info, reduced points, instances)."""
    import cv2
    rng = np.random.default_rng([seed, idx])
    n_obj = int(rng.integers(cfg.objects[0], cfg.objects[1] + 1))
    n_clutter = int(rng.integers(cfg.clutter[0], cfg.clutter[1] + 1))
    scene = sample_scene(rng, KITTI_CLASSES, n_obj, area=cfg.area, fov_deg=cfg.fov_deg,
                         n_clutter=n_clutter, sensor=cfg.sensor)
    hw = (calib.height, calib.width)
    reduced = scene.points[in_image_mask(scene.points, calib.lidar2img(2), hw)]
    instances = _instances(scene, reduced, calib)
    name, train_dir = f'{idx:06d}', osp.join(root, 'training')
    scene.points.tofile(osp.join(train_dir, 'velodyne', f'{name}.bin'))
    reduced.tofile(osp.join(train_dir, 'velodyne_reduced', f'{name}.bin'))
    img = render_image(scene, calib.lidar2img(2), hw, _CLASS_BGR, calib.lidar2cam)
    ok, png = cv2.imencode('.png', img)
    assert ok, 'cv2 could not encode the image'
    png.tofile(osp.join(train_dir, 'image_2', f'{name}.png'))
    with open(osp.join(train_dir, 'calib', f'{name}.txt'), 'w') as f:
        f.write(calib.text())
    with open(osp.join(train_dir, 'label_2', f'{name}.txt'), 'w') as f:
        f.writelines(_label_line(inst['_name'], inst) for inst in instances)
    plane = _ground_plane(calib, scene.ground_z)
    with open(osp.join(train_dir, 'planes', f'{name}.txt'), 'w') as f:
        f.write('# Plane\nWidth 4\nHeight 1\n' + ' '.join(f'{v:.6e}' for v in plane) + '\n')
    info = _frame_info(idx, instances, calib, reduced.shape[1], plane)
    return info, reduced, instances


def write_kitti(out_dir: str, train_frames: int, val_frames: int, seed: int = 0,
                cfg: KittiSceneConfig = KittiSceneConfig(), progress: bool = True,
                overwrite: bool = False) -> dict:
    """Write the whole dataset; returns counts of frames and objects per class.

    Args:
        out_dir: dataset root: absent or empty (created), or any folder with
            ``overwrite``. The marker ``.synthetic_kitti`` is written first (saying
            incomplete), the info files last (each atomically), then the marker says
            complete.
        train_frames: frames in the train split (ids 0 .. train_frames - 1).
        val_frames: frames in the val split (the ids after the train ones).
        seed: frame ``i`` uses ``np.random.default_rng([seed, i])``.
        cfg: scene content (see :class:`KittiSceneConfig`).
        progress: show a tqdm progress bar.
        overwrite: write into a non-empty ``out_dir`` (files of the same names are
            replaced). Defaults to False: a non-empty folder raises
            :class:`~.target.TargetNotEmptyError` before anything is written.
    """
    from tqdm import tqdm
    if train_frames < 1 or val_frames < 1:
        raise ValueError(f'train_frames={train_frames} and val_frames={val_frames}: '
                         'both splits need at least one frame')
    check_target(out_dir, 'kitti', overwrite)
    write_marker(out_dir, 'kitti', dict(train_frames=train_frames, val_frames=val_frames,
                                        seed=seed, cfg=repr(cfg)))
    calib = KittiCalib()
    for sub in ('velodyne', 'velodyne_reduced', 'image_2', 'calib', 'label_2', 'planes'):
        os.makedirs(osp.join(out_dir, 'training', sub), exist_ok=True)
    os.makedirs(osp.join(out_dir, 'ImageSets'), exist_ok=True)
    splits = {'train': range(train_frames),
              'val': range(train_frames, train_frames + val_frames)}
    db = _GtDatabase(out_dir)
    infos: Dict[str, List[dict]] = {'train': [], 'val': []}
    counts: Dict[str, int] = {}
    bar = tqdm(total=train_frames + val_frames, desc='synthetic KITTI', unit='frame',
               disable=not progress)
    for split, ids in splits.items():
        for idx in ids:
            info, reduced, instances = write_frame(out_dir, idx, seed, cfg, calib)
            infos[split].append(info)
            if split == 'train':
                db.add(idx, reduced, instances)
            for inst in instances:
                counts[inst['_name']] = counts.get(inst['_name'], 0) + 1
            bar.update()
    bar.close()
    for split, ids in splits.items():
        with open(osp.join(out_dir, 'ImageSets', f'{split}.txt'), 'w') as f:
            f.writelines(f'{i:06d}\n' for i in ids)
        _dump(dict(metainfo=_metainfo(), data_list=infos[split]),
              osp.join(out_dir, f'kitti_infos_{split}.pkl'))
    with open(osp.join(out_dir, 'ImageSets', 'trainval.txt'), 'w') as f:
        f.writelines(f'{i:06d}\n' for ids in splits.values() for i in ids)
    _dump(dict(metainfo=_metainfo(), data_list=infos['train'] + infos['val']),
          osp.join(out_dir, 'kitti_infos_trainval.pkl'))
    _dump(db.infos, osp.join(out_dir, 'kitti_dbinfos_train.pkl'))
    mark_complete(out_dir, 'kitti')  # last: an interrupted run leaves it incomplete
    return dict(train_frames=train_frames, val_frames=val_frames, objects=counts)


def ensure_kitti(data_root: str, train_frames: int, val_frames: int, seed: int) -> float:
    """Write synthetic KITTI data unless ``data_root`` already has it; seconds spent.

    Data is generated only into an absent or empty folder, or one the generator wrote
    before (its ``.synthetic_kitti`` marker is there; an interrupted run's marker says
    incomplete and the folder is written again): never
    over files of unknown origin, which may be a real dataset.

    Raises:
        TargetNotEmptyError: ``data_root`` lacks the demo's info files and holds
            other files without the generator's marker.
    """
    from .target import (TargetNotEmptyError, describe_entries, entries, incomplete_run,
                         synthetic_kind)
    needed = ('kitti_infos_train.pkl', 'kitti_infos_val.pkl', 'kitti_dbinfos_train.pkl')
    if (all(osp.isfile(osp.join(data_root, f)) for f in needed)
            and incomplete_run(data_root) is None):
        kind = 'synthetic ' if synthetic_kind(data_root) == 'kitti' else ''
        print(f'[demo] using the {kind}data in {data_root}')
        return 0.0
    names = entries(data_root)
    if names and synthetic_kind(data_root) != 'kitti':
        missing = [f for f in needed if not osp.isfile(osp.join(data_root, f))]
        raise TargetNotEmptyError(
            f'[demo] data_root {data_root!r} lacks {", ".join(missing)} but is not empty '
            f'({describe_entries(names)}) and has no .synthetic_kitti marker, so it may '
            'hold real data: the demo generates data only into an absent or empty folder '
            'or one it generated before. Move the files away, or generate the data '
            'yourself with `python tools/create_synthetic_data.py kitti --out '
            f'{data_root.rstrip("/")} --overwrite` if the folder is yours to overwrite.')
    print(f'[demo] writing synthetic KITTI data to {data_root} '
          f'({train_frames} train + {val_frames} val frames, seed {seed})')
    start = time.perf_counter()
    # overwrite only reaches a folder this generator wrote (the marker check above)
    write_kitti(data_root, train_frames, val_frames, seed=seed, overwrite=bool(names))
    return time.perf_counter() - start
