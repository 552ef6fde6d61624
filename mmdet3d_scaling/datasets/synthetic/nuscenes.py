"""Write a synthetic dataset in nuScenes' on-disk format, as mmdet3d 1.4 reads it.

Output (``out_dir``), the layout of ``data/nuscenes`` after mmdet3d's converter::

    samples/LIDAR_TOP/*.pcd.bin      float32 x, y, z, intensity (0-255), ring (0-31)
    sweeps/LIDAR_TOP/*.pcd.bin       non-key LiDAR sweeps before each key frame
    samples/CAM_*/*.jpg              six cameras, boxes drawn as solids coloured by class
    nuscenes_gt_database/*.bin       ObjectSample database (train split), as mmdet3d's
    nuscenes_dbinfos_train.pkl       create_gt_database.py writes it
    v1.0-trainval/*.json             the nuScenes database tables (or v1.0-mini/)
    maps/*.png                       placeholder map masks (the devkit wants the files)
    nuscenes_infos_{train,val}.pkl   mmdet3d's v2 info files (info_version 1.1)

Scenes are temporal: the ego car drives (constant speed and yaw rate), objects keep
their identity across the scene's samples (instances with prev/next annotation links)
and move at constant velocity, so ``nuscenes.NuScenes.box_velocity`` gives back the
velocity written to the infos. Scene names come from the official split lists
(``nuscenes.utils.splits``), so the devkit's ``NuScenesEval`` (run by mmdet3d's
``NuScenesMetric``) evaluates the val split as it would real nuScenes.

Every frame is written as soon as it is sampled; only the table rows and info dicts
stay in memory. Randomness: one ``numpy.random.Generator`` per scene (layout) and one
per frame, all derived from ``seed``, so the output is a function of the arguments.
"""
import hashlib
import json
import math
import os
import os.path as osp
import pickle
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import cv2
import numpy as np

from . import exact
from .nuscenes_sensors import (HDL32_ELEVATIONS_DEG, LIDAR_TRANSLATION, LIDAR_YAW,
                               CameraModel, box_corners, camera_models, image_bbox,
                               matrix_quaternion, pose_matrix, render_camera,
                               yaw_matrix, yaw_quaternion)
from .scene import SensorModel, SizePrior, clutter_size, points_in_box_mask, scan_boxes
from ...utils.atomic_io import atomic_writer
from .target import check_target, mark_complete, write_marker

__all__ = ['NUSCENES_CLASSES', 'CLASS_COLORS', 'NuScenesSyntheticConfig', 'generate_nuscenes',
           'multi_sweep_points']

#: The 10 detection classes in mmdet3d's order, with nuScenes' mean sizes (l, w, h).
NUSCENES_CLASSES: Dict[str, SizePrior] = {
    'car': SizePrior((4.63, 1.97, 1.74), intensity=0.6, weight=4.0),
    'truck': SizePrior((6.93, 2.51, 2.84), intensity=0.55, weight=1.2),
    'trailer': SizePrior((12.29, 2.90, 3.87), intensity=0.5, weight=0.5),
    'bus': SizePrior((11.10, 2.94, 3.47), intensity=0.55, weight=0.6),
    'construction_vehicle': SizePrior((6.37, 2.85, 3.19), intensity=0.45, weight=0.5),
    'bicycle': SizePrior((1.76, 0.60, 1.44), intensity=0.4, weight=1.0),
    'motorcycle': SizePrior((2.11, 0.77, 1.47), intensity=0.5, weight=1.0),
    'pedestrian': SizePrior((0.73, 0.67, 1.77), intensity=0.3, weight=3.0),
    'traffic_cone': SizePrior((0.41, 0.41, 1.07), intensity=0.85, weight=1.5),
    'barrier': SizePrior((2.53, 0.50, 0.98), intensity=0.7, weight=1.5),
}
_CLASS_NAMES = tuple(NUSCENES_CLASSES)

# detection class -> the nuScenes category written to the tables
_CATEGORY = {
    'car': 'vehicle.car', 'truck': 'vehicle.truck', 'trailer': 'vehicle.trailer',
    'bus': 'vehicle.bus.rigid', 'construction_vehicle': 'vehicle.construction',
    'bicycle': 'vehicle.bicycle', 'motorcycle': 'vehicle.motorcycle',
    'pedestrian': 'human.pedestrian.adult', 'traffic_cone': 'movable_object.trafficcone',
    'barrier': 'movable_object.barrier',
}
# the full nuScenes category list (23), so the table looks like the real one
_ALL_CATEGORIES = (
    'human.pedestrian.adult', 'human.pedestrian.child', 'human.pedestrian.wheelchair',
    'human.pedestrian.stroller', 'human.pedestrian.personal_mobility',
    'human.pedestrian.police_officer', 'human.pedestrian.construction_worker', 'animal',
    'vehicle.car', 'vehicle.motorcycle', 'vehicle.bicycle', 'vehicle.bus.bendy',
    'vehicle.bus.rigid', 'vehicle.truck', 'vehicle.construction', 'vehicle.emergency.ambulance',
    'vehicle.emergency.police', 'vehicle.trailer', 'movable_object.barrier',
    'movable_object.trafficcone', 'movable_object.pushable_pullable', 'movable_object.debris',
    'static_object.bicycle_rack')
#: nuScenes attributes, in mmdet3d's order (its ``attr_label`` indexes this + 'None').
ATTRIBUTES = ('cycle.with_rider', 'cycle.without_rider', 'pedestrian.moving',
              'pedestrian.standing', 'pedestrian.sitting_lying_down', 'vehicle.moving',
              'vehicle.parked', 'vehicle.stopped')
_VISIBILITY = (('1', 'v0-40'), ('2', 'v40-60'), ('3', 'v60-80'), ('4', 'v80-100'))
_MAPS = ('singapore-onenorth', 'boston-seaport', 'singapore-queenstown',
         'singapore-hollandvillage')


@dataclass(frozen=True)
class _Motion:
    p_moving: float  # probability that an instance moves
    speed: Tuple[float, float]  # m/s range when moving
    max_range: float  # metres from the ego car: within the evaluation's class range


_MOTION = {
    'car': _Motion(0.5, (3.0, 12.0), 48.0), 'truck': _Motion(0.4, (3.0, 10.0), 48.0),
    'trailer': _Motion(0.2, (3.0, 8.0), 48.0), 'bus': _Motion(0.5, (3.0, 10.0), 48.0),
    'construction_vehicle': _Motion(0.2, (1.0, 3.0), 48.0),
    'bicycle': _Motion(0.6, (2.0, 6.0), 38.0), 'motorcycle': _Motion(0.5, (3.0, 10.0), 38.0),
    'pedestrian': _Motion(0.7, (0.8, 1.8), 38.0), 'traffic_cone': _Motion(0.0, (0, 0), 28.0),
    'barrier': _Motion(0.0, (0, 0), 28.0),
}
#: RGB colour each class is drawn with in the camera images.
CLASS_COLORS = {
    'car': (30, 90, 220), 'truck': (240, 140, 20), 'trailer': (150, 75, 20),
    'bus': (240, 220, 30), 'construction_vehicle': (160, 60, 210),
    'bicycle': (20, 210, 220), 'motorcycle': (230, 40, 170), 'pedestrian': (220, 30, 30),
    'traffic_cone': (245, 245, 245), 'barrier': (110, 230, 60),
}
_CLUTTER_COLORS = {'pole': (75, 75, 80), 'wall': (150, 140, 130), 'bush': (50, 95, 45)}
_KEY_INTERVAL = 0.5  # s between key frames (2 Hz annotations)
_SWEEP_INTERVAL = 0.05  # s between LiDAR sweeps (20 Hz)
_EGO_RADIUS = 2.7  # m, footprint circle of the ego car
_START_US = 1533151603547590  # first scene's first timestamp (2018-08-01), microseconds


def nuscenes_lidar_model(density: float = 3000.0) -> SensorModel:
    """The HDL-32E on the roof: 1.84 m above the ground, 70 m range."""
    return SensorModel(height=LIDAR_TRANSLATION[2], max_range=70.0, density=density,
                       ground_points=14000, noise=0.02)


@dataclass
class NuScenesSyntheticConfig:
    """What :func:`generate_nuscenes` writes.

    Args:
        out_dir: data root to create (``data_root`` of mmdet3d's nuScenes configs).
        train_frames: key frames (samples) in the train split. Defaults to 120.
        val_frames: key frames in the val split. Defaults to 40.
        seed: the only source of randomness. Defaults to 0.
        version: 'v1.0-trainval' (the version mmdet3d's NuScenesDataset assumes) or
            'v1.0-mini' (then configs must pass ``metainfo=dict(version='v1.0-mini')``).
        samples_per_scene: key frames per scene (real nuScenes: about 40); scenes are
            capped by the split's official scene list. Defaults to 10.
        sweeps: non-key LiDAR sweeps before each key frame (0-9, real: 9). Defaults to 3.
        max_sweeps: most entries in each info's ``lidar_sweeps`` (as the converter's
            ``max_sweeps``). Defaults to 10.
        image_size: (height, width) of the camera images; (900, 1600) is the real size.
            Defaults to (256, 704), BEVFusion's network input.
        objects_per_sample: annotated objects near the ego car per key frame (about).
            Defaults to 20.
        clutter_per_sample: poles, walls and bushes (unannotated) per key frame (about).
            Defaults to 12.
        lidar_density: surface points per m^2 at 1 m (see ``SensorModel.density``).
            Defaults to 3000 (about 13k points a scan).
        gt_database: write the ObjectSample database of the train split. Defaults to True.
        max_range: if given, objects are placed at most this far (metres) from the ego
            car (at the time they are placed; a moving car drives away from them), e.g.
            to keep them inside a small model's point-cloud range. Defaults to None:
            the evaluation's class ranges.
        overwrite: write into a non-empty ``out_dir`` (files of the same names are
            replaced). Defaults to False: :meth:`validate` refuses a non-empty folder.
            The marker ``.synthetic_nuscenes`` is written before any frame.
    """
    out_dir: str
    train_frames: int = 120
    val_frames: int = 40
    seed: int = 0
    version: str = 'v1.0-trainval'
    samples_per_scene: int = 10
    sweeps: int = 3
    max_sweeps: int = 10
    image_size: Tuple[int, int] = (256, 704)
    objects_per_sample: int = 20
    clutter_per_sample: int = 12
    lidar_density: float = 3000.0
    max_range: Optional[float] = None
    gt_database: bool = True
    overwrite: bool = False

    def validate(self) -> None:
        """Raise ValueError naming the first bad value (TargetNotEmptyError for a
        non-empty ``out_dir`` without ``overwrite``)."""
        if self.version not in ('v1.0-trainval', 'v1.0-mini'):
            raise ValueError(f'version={self.version!r}: use v1.0-trainval or v1.0-mini')
        for name in ('train_frames', 'val_frames', 'samples_per_scene'):
            if getattr(self, name) < 1:
                raise ValueError(f'{name}={getattr(self, name)}: must be >= 1')
        if not 0 <= self.sweeps <= 9:
            raise ValueError(f'sweeps={self.sweeps}: must be in 0..9 (20 Hz LiDAR, 2 Hz keys)')
        if self.max_sweeps < 0:
            raise ValueError(f'max_sweeps={self.max_sweeps}: must be >= 0')
        h, w = self.image_size
        if h < 32 or w < 32:
            raise ValueError(f'image_size={self.image_size}: height and width must be >= 32')
        if self.max_range is not None and self.max_range < 8:
            raise ValueError(f'max_range={self.max_range}: must be >= 8 (metres) or None')
        if self.objects_per_sample < 1 or self.clutter_per_sample < 0:
            raise ValueError('objects_per_sample must be >= 1 and clutter_per_sample >= 0, '
                             f'got {self.objects_per_sample}, {self.clutter_per_sample}')
        check_target(self.out_dir, 'nuscenes', self.overwrite)


# ------------------------------------------------------------------------- the world
@dataclass
class _Track:
    """One object over a scene, in the global frame."""
    label: int
    lwh: np.ndarray
    xy0: np.ndarray  # centre at scene time 0
    yaw: float
    velocity: np.ndarray  # (2,) m/s
    attribute: str  # '' for classes without attributes

    def xy(self, t: np.ndarray) -> np.ndarray:
        return self.xy0 + np.multiply.outer(t, self.velocity)


@dataclass
class _World:
    """A scene's ego trajectory, objects and clutter (global frame, z = 0 on the ground)."""
    ego_xy0: np.ndarray
    ego_yaw0: float
    ego_speed: float
    ego_yaw_rate: float
    sun: np.ndarray  # unit vector towards the sun, global frame
    tracks: List[_Track] = field(default_factory=list)
    clutter: List[Tuple[np.ndarray, str]] = field(default_factory=list)

    def ego_pose(self, t) -> Tuple[np.ndarray, np.ndarray]:
        """(xy (..., 2), yaw (...)) of the ego car at scene time(s) ``t``."""
        t = np.asarray(t, float)
        yaw = self.ego_yaw0 + self.ego_yaw_rate * t
        if abs(self.ego_yaw_rate) < 1e-9:
            sin, cos = exact.sincos(yaw)
            dx, dy = self.ego_speed * t * cos, self.ego_speed * t * sin
        else:
            k = self.ego_speed / self.ego_yaw_rate
            (sin, cos), (sin0, cos0) = exact.sincos(yaw), exact.sincos(self.ego_yaw0)
            dx = k * (sin - sin0)
            dy = -k * (cos - cos0)
        return self.ego_xy0 + np.stack([dx, dy], -1), yaw

    def ego2global(self, t: float) -> np.ndarray:
        xy, yaw = self.ego_pose(t)
        return pose_matrix(yaw_matrix(float(yaw)), [xy[0], xy[1], 0.0])

    def boxes(self, t: float) -> np.ndarray:
        """(M, 7) object boxes at time ``t``: x, y, z_bottom, l, w, h, yaw (global)."""
        return np.array([[*tr.xy(t), 0.0, *tr.lwh, tr.yaw] for tr in self.tracks]).reshape(-1, 7)


def _heading(rng: np.random.Generator, name: str, road_yaw: float, moving: bool) -> float:
    """Road-aligned headings for vehicles and barriers, free ones for the rest."""
    if name in ('pedestrian', 'traffic_cone') or (name == 'construction_vehicle' and not moving):
        if name == 'pedestrian' and moving:
            return road_yaw + rng.choice([0, np.pi, np.pi / 2, -np.pi / 2]) + rng.normal(0, 0.2)
        return rng.uniform(-np.pi, np.pi)
    turn = rng.choice([0.0, np.pi])
    if not moving and rng.random() < 0.2:
        turn += np.pi / 2  # parked across, or a barrier across the road
    return road_yaw + turn + rng.normal(0, 0.05 if moving else 0.1)


def _attribute(rng: np.random.Generator, name: str, moving: bool) -> str:
    if name in ('traffic_cone', 'barrier'):
        return ''
    if name in ('bicycle', 'motorcycle'):
        return 'cycle.with_rider' if moving else 'cycle.without_rider'
    if name == 'pedestrian':
        if moving:
            return 'pedestrian.moving'
        return 'pedestrian.sitting_lying_down' if rng.random() < 0.1 else 'pedestrian.standing'
    if moving:
        return 'vehicle.moving'
    return 'vehicle.stopped' if rng.random() < 0.3 else 'vehicle.parked'


class _Layout:
    """Places footprint circles over a scene's time grid without collisions."""

    def __init__(self, world: _World, times: np.ndarray):
        self.world, self.times = world, times
        self.ego_xy = world.ego_pose(times)[0]
        self.trajs: List[np.ndarray] = []  # (T, 2) each
        self.radii: List[float] = []

    def fits(self, traj: np.ndarray, radius: float) -> bool:
        if np.min(exact.norm(traj - self.ego_xy, axis=-1)) < radius + _EGO_RADIUS + 0.5:
            return False
        if not self.trajs:
            return True
        gaps = exact.norm(np.stack(self.trajs) - traj, axis=-1).min(1)
        return bool(np.all(gaps > np.asarray(self.radii) + radius + 0.3))

    def add(self, traj: np.ndarray, radius: float) -> None:
        self.trajs.append(traj)
        self.radii.append(radius)


def _candidate_track(rng: np.random.Generator, label: int, world: _World, t_c: float,
                     r_max: float) -> _Track:
    """An object of class ``label`` within ``r_max`` metres of the ego car at time ``t_c``."""
    name = _CLASS_NAMES[label]
    prior, motion = NUSCENES_CLASSES[name], _MOTION[name]
    ego_xy, ego_yaw = world.ego_pose(t_c)
    r, phi = np.sqrt(rng.uniform(5.0 ** 2, r_max ** 2)), rng.uniform(-np.pi, np.pi)
    sin, cos = exact.sincos(ego_yaw + phi)
    centre = ego_xy + r * np.array([cos, sin])
    moving = rng.random() < motion.p_moving
    yaw = _heading(rng, name, float(ego_yaw), moving)
    speed = rng.uniform(*motion.speed) if moving else 0.0
    sin, cos = exact.sincos(yaw)
    velocity = speed * np.array([cos, sin])
    lwh = np.asarray(prior.lwh) * np.clip(rng.normal(1, prior.rel_std, 3), 0.8, 1.2)
    attribute = _attribute(rng, name, moving)
    if attribute == 'pedestrian.sitting_lying_down':
        lwh[2] *= 0.6
    return _Track(label, lwh, centre - velocity * t_c, float(yaw), velocity, attribute)


def _sample_world(rng: np.random.Generator, cfg: NuScenesSyntheticConfig, duration: float,
                  origin: np.ndarray) -> _World:
    """Ego motion, then one object of each class near the middle of the scene (so every
    class is in every scene), then more objects and clutter anywhere along the drive."""
    sun = np.array([rng.uniform(-0.5, 0.5), rng.uniform(-0.5, 0.5), 1.0])
    world = _World(ego_xy0=origin + rng.uniform(-200, 200, 2),
                   ego_yaw0=rng.uniform(-np.pi, np.pi),
                   ego_speed=float(rng.choice([0.0, rng.uniform(2, 10)], p=[0.15, 0.85])),
                   ego_yaw_rate=float(rng.uniform(-0.05, 0.05)), sun=sun / exact.norm(sun))
    times = np.arange(-(cfg.sweeps + 1) * _SWEEP_INTERVAL, duration + _SWEEP_INTERVAL,
                      _SWEEP_INTERVAL)
    layout = _Layout(world, times)
    extent = 1.0 + world.ego_speed * duration / 60.0  # more objects on longer drives
    weights = np.array([p.weight for p in NUSCENES_CLASSES.values()])
    n_classes = len(_CLASS_NAMES)
    for k in range(max(n_classes, int(round(cfg.objects_per_sample * extent)))):
        label = k if k < n_classes else int(rng.choice(n_classes, p=weights / weights.sum()))
        r_max = min(_MOTION[_CLASS_NAMES[label]].max_range, cfg.max_range or np.inf)
        r_max = max(6.0, r_max * (0.6 if k < n_classes else 1.0))
        for _ in range(40):
            t_c = duration / 2 if k < n_classes else rng.uniform(0, duration)
            track = _candidate_track(rng, label, world, t_c, r_max)
            traj, radius = track.xy(times), float(exact.hypot(*track.lwh[:2]) / 2)
            if layout.fits(traj, radius):
                layout.add(traj, radius)
                world.tracks.append(track)
                break
    kinds = ('pole', 'wall', 'bush')
    for _ in range(int(round(cfg.clutter_per_sample * extent))):
        kind = kinds[int(rng.choice(3, p=[0.5, 0.2, 0.3]))]
        for _ in range(20):
            ego_xy, ego_yaw = world.ego_pose(rng.uniform(0, duration))
            r = rng.uniform(15.0 if kind == 'wall' else 6.0, 60.0)
            phi = rng.uniform(-np.pi, np.pi)
            sin, cos = exact.sincos(ego_yaw + phi)
            xy = ego_xy + r * np.array([cos, sin])
            lwh = clutter_size(rng, kind)
            yaw = (float(ego_yaw + rng.normal(0, 0.1)) if kind == 'wall'
                   else rng.uniform(-np.pi, np.pi))
            traj = np.broadcast_to(xy, (len(times), 2))
            radius = float(exact.hypot(lwh[0], lwh[1]) / 2)
            if layout.fits(traj, radius):
                layout.add(traj, radius)
                world.clutter.append((np.array([xy[0], xy[1], 0.0, *lwh, yaw]), kind))
                break
    return world


# ------------------------------------------------------------------------ geometry
def _wrap(angle):
    return (np.asarray(angle) + np.pi) % (2 * np.pi) - np.pi


def _boxes_to_frame(boxes: np.ndarray, frame2global: np.ndarray) -> np.ndarray:
    """Global (x, y, z_bottom, l, w, h, yaw) boxes into a z-up frame (ego or LiDAR)."""
    g2f = exact.rigid_inverse(frame2global)
    out = boxes.copy()
    out[:, :3] = exact.matmul(boxes[:, :3], g2f[:3, :3].T) + g2f[:3, 3]
    frame_yaw = exact.arctan2(frame2global[1, 0], frame2global[0, 0])
    out[:, 6] = _wrap(boxes[:, 6] - frame_yaw)
    return out


def _token(*parts) -> str:
    return hashlib.md5('/'.join(map(str, parts)).encode()).hexdigest()


def _lidar2ego() -> np.ndarray:
    return pose_matrix(yaw_matrix(LIDAR_YAW), LIDAR_TRANSLATION)


def _scan(rng: np.random.Generator, world: _World, t: float, sensor: SensorModel):
    """One LiDAR scan at scene time ``t``: (points (N, 5) in the LiDAR frame with
    intensity 0-255 and ring, object boxes in the LiDAR frame, their visibility)."""
    lidar2global = exact.matmul(world.ego2global(t), _lidar2ego())
    boxes = _boxes_to_frame(world.boxes(t), lidar2global)
    reach = sensor.max_range + 15.0
    near = exact.norm(boxes[:, :2], axis=1) < reach
    clutter = []
    if world.clutter:
        cboxes = _boxes_to_frame(np.stack([b for b, _ in world.clutter]), lidar2global)
        clutter = [(b, kind) for b, (_, kind) in zip(cboxes, world.clutter)
                   if exact.norm(b[:2]) < reach]
    intensity = np.array([NUSCENES_CLASSES[_CLASS_NAMES[tr.label]].intensity
                          for tr in world.tracks])
    pts, _, vis_near = scan_boxes(rng, boxes[near], intensity[near], clutter, sensor)
    visibility = np.zeros(len(boxes), np.float32)
    visibility[near] = vis_near
    elevation = exact.arctan2(pts[:, 2], exact.norm(pts[:, :2], axis=1)) * (180 / np.pi)
    step = HDL32_ELEVATIONS_DEG[1] - HDL32_ELEVATIONS_DEG[0]
    ring = np.clip(np.round((elevation - HDL32_ELEVATIONS_DEG[0]) / step), 0, 31)
    points = np.concatenate([pts[:, :3], np.round(pts[:, 3:4] * 255), ring[:, None]], 1)
    return points.astype(np.float32), boxes, visibility


# -------------------------------------------------------------------------- tables
class _Tables:
    """The nuScenes database rows, written as ``<version>/<table>.json``."""
    NAMES = ('attribute', 'calibrated_sensor', 'category', 'ego_pose', 'instance', 'log',
             'map', 'sample', 'sample_annotation', 'sample_data', 'scene', 'sensor',
             'visibility')

    def __init__(self, seed: int, static: bool = True):
        self.seed = seed
        self.rows: Dict[str, List[dict]] = {name: [] for name in self.NAMES}
        self.category = {name: _token(seed, 'category', name) for name in _ALL_CATEGORIES}
        self.attribute = {name: _token(seed, 'attribute', name) for name in ATTRIBUTES}
        self.sensor = {ch: _token(seed, 'sensor', ch) for ch in ('LIDAR_TOP', *_camera_channels())}
        if static:
            self._add_static_rows()

    def _add_static_rows(self) -> None:
        for name, tok in self.category.items():
            self.rows['category'].append(dict(token=tok, name=name, description=name))
        for name, tok in self.attribute.items():
            self.rows['attribute'].append(dict(token=tok, name=name, description=name))
        for level, (tok, desc) in enumerate(_VISIBILITY):
            self.rows['visibility'].append(dict(token=tok, level=desc,
                                                description=f'visibility of the instance: {desc}'))
        for ch, tok in self.sensor.items():
            self.rows['sensor'].append(dict(token=tok, channel=ch,
                                            modality='lidar' if ch == 'LIDAR_TOP' else 'camera'))

    def add(self, table: str, **row) -> dict:
        """Append ``row`` to ``table``; returns the row (its ``token`` is the key)."""
        self.rows[table].append(row)
        return row

    @staticmethod
    def link(rows: Sequence[dict]) -> None:
        """Set ``prev``/``next`` of ``rows``, in time order, to their neighbours' tokens."""
        for i, row in enumerate(rows):
            row['prev'] = rows[i - 1]['token'] if i > 0 else ''
            row['next'] = rows[i + 1]['token'] if i + 1 < len(rows) else ''

    def extend(self, rows: Dict[str, List[dict]]) -> None:
        for name, table_rows in rows.items():
            self.rows[name].extend(table_rows)

    def add_maps(self) -> None:
        """One map per location, listing the logs recorded there (the devkit needs it)."""
        for location in dict.fromkeys(log['location'] for log in self.rows['log']):
            tok = _token(self.seed, 'map', location)
            self.add('map', token=tok, category='semantic_prior', filename=f'maps/{tok}.png',
                     log_tokens=[log['token'] for log in self.rows['log']
                                 if log['location'] == location])

    def dump(self, root: str, version: str) -> None:
        table_dir = osp.join(root, version)
        os.makedirs(table_dir, exist_ok=True)
        os.makedirs(osp.join(root, 'maps'), exist_ok=True)
        for rec in self.rows['map']:
            cv2.imwrite(osp.join(root, rec['filename']), np.zeros((64, 64), np.uint8))
        for name, rows in self.rows.items():
            with open(osp.join(table_dir, f'{name}.json'), 'w') as f:
                json.dump(rows, f)


def _camera_channels() -> Tuple[str, ...]:
    from .nuscenes_sensors import CAMERAS
    return tuple(CAMERAS)


# ------------------------------------------------------------------------- writer
def _split_scenes(version: str, split: str, n_frames: int, per_scene: int) -> List[Tuple[str, int]]:
    """(official scene name, key frames) for each scene of ``split``."""
    from nuscenes.utils import splits
    names = {('v1.0-trainval', 'train'): splits.train, ('v1.0-trainval', 'val'): splits.val,
             ('v1.0-mini', 'train'): splits.mini_train, ('v1.0-mini', 'val'): splits.mini_val}
    names = names[(version, split)]
    n_scenes = min(len(names), max(1, math.ceil(n_frames / per_scene)))
    sizes = [n_frames // n_scenes + (1 if i < n_frames % n_scenes else 0) for i in range(n_scenes)]
    return list(zip(names[:n_scenes], sizes))


def _m(mat: np.ndarray) -> List[List[float]]:
    return np.asarray(mat, float).tolist()


class _SceneWriter:
    """Writes one scene: its files, its table rows (into ``tables``) and its infos.

    Args:
        cfg: the dataset being written.
        tables: where the scene's table rows go.
        split: 'train' or 'val'.
        scene_idx: index of the scene in its split (seeds the scene's generators).
        global_idx: index over all scenes (log name, timestamps, map).
        name: official nuScenes scene name.
        n_samples: key frames in the scene.
        first_idx: ``sample_idx`` of the scene's first key frame in its split.
    """

    def __init__(self, cfg: NuScenesSyntheticConfig, tables: _Tables, split: str,
                 scene_idx: int, global_idx: int, name: str, n_samples: int,
                 first_idx: int):
        self.cfg, self.tables, self.seed = cfg, tables, cfg.seed
        self.name, self.n_samples, self.first_idx = name, n_samples, first_idx
        self.gt_database = cfg.gt_database and split == 'train'
        self.db_entries: List[dict] = []  # ObjectSample entries, without group_id
        self.rng_key = [cfg.seed, 0 if split == 'train' else 1, scene_idx]
        self.cams = camera_models(*cfg.image_size)
        self.sensor = nuscenes_lidar_model(cfg.lidar_density)
        origin = np.array([300.0 + 400 * (global_idx % 4), 700.0 + 300 * (global_idx % 3)])
        self.world = _sample_world(np.random.default_rng(self.rng_key), cfg,
                                   (n_samples - 1) * _KEY_INTERVAL, origin)
        self.start_us = _START_US + global_idx * 3_600_000_000
        self.logfile = (f'n015-2018-08-01-{global_idx // 60 % 24:02d}-'
                        f'{global_idx % 60:02d}-00+0800')
        self.log_token = tables.add(
            'log', token=_token(self.seed, 'log', name), logfile=self.logfile, vehicle='n015',
            date_captured='2018-08-01', location=_MAPS[global_idx % len(_MAPS)])['token']
        self.calib = self._add_calibration()
        self.chains: Dict[str, List[dict]] = {ch: [] for ch in self.calib}  # sample_data
        self.ann_chains: List[List[dict]] = [[] for _ in self.world.tracks]

    def write(self, on_frame: Optional[Callable[[], None]] = None) -> List[dict]:
        """Write every frame; returns the infos (``sample_idx`` counts within the scene)."""
        cfg, tables = self.cfg, self.tables
        scene_tok = _token(self.seed, 'scene', self.name)
        sample_toks = [_token(self.seed, 'sample', self.name, k) for k in range(self.n_samples)]
        tables.link([tables.add('sample', token=tok, scene_token=scene_tok, prev='', next='',
                                timestamp=self._us(k * _KEY_INTERVAL))
                     for k, tok in enumerate(sample_toks)])
        tables.add('scene', token=scene_tok, log_token=self.log_token,
                   nbr_samples=self.n_samples, first_sample_token=sample_toks[0],
                   last_sample_token=sample_toks[-1], name=self.name,
                   description=f'synthetic scene, seed {self.seed}')
        infos: List[dict] = []
        history: List[dict] = []  # LiDAR sample_data so far, newest last
        scans: Dict[str, np.ndarray] = {}  # their points (the last max_sweeps + 1)
        for k, sample_tok in enumerate(sample_toks):
            t_key = k * _KEY_INTERVAL
            for j in range(cfg.sweeps, 0, -1):
                t = t_key - j * _SWEEP_INTERVAL
                points, _, _ = _scan(self._rng(k, j), self.world, t, self.sensor)
                history.append(self._write_lidar(t, sample_tok, points, key=False))
                scans[history[-1]['token']] = points
            rng = self._rng(k, 0)
            points, boxes, visibility = _scan(rng, self.world, t_key, self.sensor)
            key_rec = self._write_lidar(t_key, sample_tok, points, key=True)
            info = self._lidar_info(self.first_idx + k, sample_tok, key_rec,
                                    history[::-1][:cfg.max_sweeps])
            history.append(key_rec)
            scans[key_rec['token']] = points
            info['instances'] = self._annotate(t_key, sample_tok, points, boxes, visibility)
            info['images'], info['cam_instances'] = self._write_cameras(rng, t_key, sample_tok)
            if self.gt_database:
                self._write_db_entries(info, points, scans)
            for tok in [rec['token'] for rec in history[:-cfg.max_sweeps - 1]]:
                scans.pop(tok, None)
            infos.append(info)
            if on_frame is not None:
                on_frame()
        for chain in self.chains.values():
            tables.link(chain)
        self._add_instances()
        return infos

    def _write_db_entries(self, info: dict, points: np.ndarray,
                          scans: Dict[str, np.ndarray]) -> None:
        """Cut the objects of one train key frame out of its multi-sweep point cloud,
        as mmdet3d's ``create_gt_database.py`` does for nuScenes (valid boxes only,
        points relative to the box bottom centre)."""
        sweeps = [(scans[sw['sample_data_token']], np.asarray(sw['lidar_points']['lidar2sensor']),
                   info['timestamp'] - sw['timestamp']) for sw in info['lidar_sweeps']]
        cloud = multi_sweep_points(points, sweeps)
        valid = [inst for inst in info['instances'] if inst['bbox_3d_isvalid']]
        folder = osp.join(self.cfg.out_dir, 'nuscenes_gt_database')
        os.makedirs(folder, exist_ok=True)
        for i, inst in enumerate(valid):
            box = np.array([*inst['bbox_3d'], *inst['velocity']], np.float32)
            box[2] -= box[5] / 2  # gravity centre -> bottom centre
            obj = cloud[points_in_box_mask(cloud[:, :3], box[:7].astype(np.float64))]
            obj[:, :3] -= box[:3]
            name = _CLASS_NAMES[inst['bbox_label_3d']]
            filename = f'{info["sample_idx"]}_{name}_{i}.bin'
            obj.tofile(osp.join(folder, filename))
            self.db_entries.append(dict(
                name=name, path=f'nuscenes_gt_database/{filename}',
                image_idx=info['sample_idx'], gt_idx=i, box3d_lidar=box,
                num_points_in_gt=len(obj), difficulty=np.int32(0)))

    def _rng(self, key_frame: int, sweep: int) -> np.random.Generator:
        """The generator of one LiDAR frame (sweep 0: the key frame and its images)."""
        return np.random.default_rng(self.rng_key + [key_frame, sweep])

    def _us(self, t: float) -> int:
        return self.start_us + int(round(t * 1e6))

    # -- calibration and sample_data
    def _add_calibration(self) -> Dict[str, dict]:
        calib = {}
        tok = self.tables.add(
            'calibrated_sensor', token=_token(self.seed, 'calib', self.name, 'LIDAR_TOP'),
            sensor_token=self.tables.sensor['LIDAR_TOP'], translation=list(LIDAR_TRANSLATION),
            rotation=yaw_quaternion(LIDAR_YAW), camera_intrinsic=[])['token']
        calib['LIDAR_TOP'] = tok
        for cam in self.cams:
            calib[cam.channel] = self.tables.add(
                'calibrated_sensor', token=_token(self.seed, 'calib', self.name, cam.channel),
                sensor_token=self.tables.sensor[cam.channel],
                translation=cam.cam2ego[:3, 3].tolist(),
                rotation=matrix_quaternion(cam.cam2ego[:3, :3]),
                camera_intrinsic=_m(cam.intrinsic))['token']
        return calib

    def _add_sample_data(self, t: float, sample_tok: str, channel: str, key: bool,
                         height: int = 0, width: int = 0) -> dict:
        """sample_data + ego_pose rows of one file; returns token, filename, timestamp,
        ego2global of the file."""
        ts = self._us(t)
        ext = 'jpg' if channel.startswith('CAM') else 'pcd.bin'
        filename = (f'{"samples" if key else "sweeps"}/{channel}/'
                    f'{self.logfile}__{channel}__{ts}.{ext}')
        e2g = self.world.ego2global(t)
        pose_tok = self.tables.add(
            'ego_pose', token=_token(self.seed, 'pose', self.logfile, channel, ts),
            timestamp=ts, rotation=matrix_quaternion(e2g[:3, :3]),
            translation=e2g[:3, 3].tolist())['token']
        row = self.tables.add(
            'sample_data', token=_token(self.seed, 'sd', self.logfile, channel, ts),
            sample_token=sample_tok, ego_pose_token=pose_tok,
            calibrated_sensor_token=self.calib[channel], timestamp=ts,
            fileformat=ext.split('.')[0], is_key_frame=key, height=height, width=width,
            filename=filename, prev='', next='')
        self.chains[channel].append(row)
        os.makedirs(osp.join(self.cfg.out_dir, osp.dirname(filename)), exist_ok=True)
        return dict(token=row['token'], filename=filename, timestamp=ts, ego2global=e2g)

    # -- LiDAR
    def _write_lidar(self, t: float, sample_tok: str, points: np.ndarray, key: bool) -> dict:
        rec = self._add_sample_data(t, sample_tok, 'LIDAR_TOP', key)
        points.astype(np.float32).tofile(osp.join(self.cfg.out_dir, rec['filename']))
        return rec

    @staticmethod
    def _lidar_info(sample_idx: int, sample_tok: str, key_rec: dict,
                    history: List[dict]) -> dict:
        """The info's LiDAR part; ``lidar_sweeps`` newest first, as the converter."""
        lidar2ego = _lidar2ego()
        lidar2global = exact.matmul(key_rec['ego2global'], lidar2ego)
        sweeps = []
        for rec in history:
            lidar2sensor = exact.matmul(
                exact.rigid_inverse(exact.matmul(rec['ego2global'], lidar2ego)), lidar2global)
            sweeps.append(dict(
                timestamp=rec['timestamp'] / 1e6, ego2global=_m(rec['ego2global']),
                sample_data_token=rec['token'],
                lidar_points=dict(lidar2ego=_m(lidar2ego), lidar_path=rec['filename'],
                                  lidar2sensor=_m(lidar2sensor))))
        return dict(
            sample_idx=sample_idx, token=sample_tok, timestamp=key_rec['timestamp'] / 1e6,
            ego2global=_m(key_rec['ego2global']),
            lidar_points=dict(num_pts_feats=5, lidar_path=osp.basename(key_rec['filename']),
                              lidar2ego=_m(lidar2ego)),
            lidar_sweeps=sweeps)

    # -- annotations
    def _annotate(self, t: float, sample_tok: str, points: np.ndarray, boxes: np.ndarray,
                  visibility: np.ndarray) -> List[dict]:
        """sample_annotation rows and info ``instances`` of one key frame; ``boxes`` and
        ``points`` are in its LiDAR frame."""
        reach = self.sensor.max_range + 15.0
        num_pts = [int(points_in_box_mask(points[:, :3], b).sum())
                   if exact.norm(b[:2]) < reach else 0 for b in boxes]
        global2lidar = exact.rigid_inverse(exact.matmul(self.world.ego2global(t), _lidar2ego()))
        instances = []
        for i, track in enumerate(self.world.tracks):
            x, y = track.xy(t)
            l, w, h = (float(v) for v in track.lwh)
            level = int(np.searchsorted([0.4, 0.6, 0.8], visibility[i], side='right'))
            self.ann_chains[i].append(self.tables.add(
                'sample_annotation', token=_token(self.seed, 'ann', self.name, i, sample_tok),
                sample_token=sample_tok, instance_token=_token(self.seed, 'inst', self.name, i),
                visibility_token=_VISIBILITY[level][0],
                attribute_tokens=([self.tables.attribute[track.attribute]]
                                  if track.attribute else []),
                translation=[float(x), float(y), h / 2], size=[w, l, h],
                rotation=yaw_quaternion(track.yaw), prev='', next='',
                num_lidar_pts=num_pts[i], num_radar_pts=0))
            velocity = exact.matmul(global2lidar[:3, :3], np.array([*track.velocity, 0.0]))
            box = boxes[i]
            instances.append(dict(
                bbox_label=track.label, bbox_label_3d=track.label,
                bbox_3d=[float(box[0]), float(box[1]), float(box[2]) + h / 2, l, w, h,
                         float(box[6])],
                bbox_3d_isvalid=num_pts[i] > 0, velocity=velocity[:2].tolist(),
                num_lidar_pts=num_pts[i], num_radar_pts=0))
        return instances

    def _add_instances(self) -> None:
        for i, track in enumerate(self.world.tracks):
            rows = self.ann_chains[i]
            self.tables.link(rows)
            category = _CATEGORY[_CLASS_NAMES[track.label]]
            self.tables.add('instance', token=_token(self.seed, 'inst', self.name, i),
                            category_token=self.tables.category[category],
                            nbr_annotations=len(rows), first_annotation_token=rows[0]['token'],
                            last_annotation_token=rows[-1]['token'])

    # -- cameras
    def _write_cameras(self, rng: np.random.Generator, t: float, sample_tok: str):
        """Render and write the six images; returns the info's ``images`` and
        ``cam_instances``."""
        world = self.world
        e2g = world.ego2global(t)
        boxes = _boxes_to_frame(world.boxes(t), e2g)  # ego frame
        solids = boxes
        if world.clutter:
            solids = np.concatenate(
                [boxes, _boxes_to_frame(np.stack([b for b, _ in world.clutter]), e2g)])
        colours = np.array([CLASS_COLORS[_CLASS_NAMES[tr.label]] for tr in world.tracks]
                           + [_CLUTTER_COLORS[kind] for _, kind in world.clutter], float)
        sun = exact.matmul(e2g[:3, :3].T, world.sun)
        images, cam_instances = {}, {}
        for cam in self.cams:
            rec = self._add_sample_data(t, sample_tok, cam.channel, True, cam.height, cam.width)
            ego2cam = exact.rigid_inverse(cam.cam2ego)
            img = render_camera(rng, cam, ego2cam, solids, colours.reshape(-1, 3), sun)
            cv2.imwrite(osp.join(self.cfg.out_dir, rec['filename']), img[:, :, ::-1],
                        [cv2.IMWRITE_JPEG_QUALITY, 92])
            cam2global = exact.matmul(rec['ego2global'], cam.cam2ego)
            lidar2cam = exact.matmul(exact.matmul(exact.rigid_inverse(cam2global), e2g),
                                     _lidar2ego())
            cam2img = np.eye(4)
            cam2img[:3, :3] = cam.intrinsic
            images[cam.channel] = dict(
                img_path=osp.basename(rec['filename']), height=cam.height, width=cam.width,
                cam2img=_m(cam.intrinsic), lidar2cam=_m(lidar2cam), cam2ego=_m(cam.cam2ego),
                lidar2img=_m(exact.matmul(cam2img, lidar2cam)), sample_data_token=rec['token'],
                timestamp=rec['timestamp'] / 1e6)
            cam_instances[cam.channel] = self._cam_instances(cam, boxes, ego2cam, cam2global)
        return images, cam_instances

    def _cam_instances(self, cam: CameraModel, boxes: np.ndarray, ego2cam: np.ndarray,
                       cam2global: np.ndarray) -> List[dict]:
        """Objects seen by ``cam``, with the fields ``update_infos_to_v2.py`` writes."""
        out = []
        for track, box in zip(self.world.tracks, boxes):
            corners = exact.matmul(box_corners(box), ego2cam[:3, :3].T) + ego2cam[:3, 3]
            bbox = image_bbox(corners, cam)
            centre = corners.mean(0)
            if bbox is None or centre[2] <= 0:
                continue
            l, w, h = (float(v) for v in track.lwh)
            # as the converter: yaw of the devkit box in the camera frame, negated
            yaw = -_quaternion_yaw(matrix_quaternion(
                exact.matmul(cam2global[:3, :3].T, yaw_matrix(track.yaw))))
            velocity = exact.matmul(cam2global[:3, :3].T, np.array([*track.velocity, 0.0]))
            uvz = exact.matmul(cam.intrinsic, centre)
            out.append(dict(
                bbox_label=track.label, bbox_label_3d=track.label, bbox=bbox,
                bbox_3d_isvalid=True, bbox_3d=[*centre.tolist(), l, h, w, float(yaw)],
                velocity=velocity[0::2].tolist(), center_2d=(uvz[:2] / uvz[2]).tolist(),
                depth=float(uvz[2]),
                attr_label=(ATTRIBUTES + ('None',)).index(track.attribute or 'None')))
        return out


def _quaternion_yaw(q: Sequence[float]) -> float:
    """pyquaternion's ``yaw_pitch_roll[0]`` of a unit quaternion (w, x, y, z), which
    mmdet3d's info converter uses, computed the same on every CPU."""
    w, x, y, z = q
    return exact.arctan2(2 * (w * z - x * y), 1 - 2 * (y * y + z * z))


def _metainfo(version: str) -> dict:
    return dict(categories={name: i for i, name in enumerate(_CLASS_NAMES)},
                dataset='nuscenes', version=version, info_version='1.1')


def multi_sweep_points(points: np.ndarray, sweeps: Sequence[Tuple[np.ndarray, np.ndarray, float]]
                       ) -> np.ndarray:
    """What ``LoadPointsFromMultiSweeps(remove_close=True)`` makes of a key frame's
    ``points`` (N, 5) and its ``sweeps``, each (points, lidar2sensor 4x4, time lag in s):
    the same transform (mmdet3d 1.4's, including its translation convention) and the
    time lag in column 4."""
    clouds = [points.copy()]
    clouds[0][:, 4] = 0
    for sweep_points, lidar2sensor, lag in sweeps:
        pts = sweep_points[~((np.abs(sweep_points[:, 0]) < 1.0)
                             & (np.abs(sweep_points[:, 1]) < 1.0))].copy()
        pts[:, :3] = pts[:, :3] @ lidar2sensor[:3, :3]
        pts[:, :3] -= lidar2sensor[:3, 3]
        pts[:, 4] = lag
        clouds.append(pts)
    return np.concatenate(clouds).astype(np.float32)


def _write_scene(job: tuple) -> Tuple[Dict[str, List[dict]], List[dict], List[dict]]:
    """Worker: write one scene; returns its table rows, infos and ObjectSample entries."""
    tables = _Tables(job[0].seed, static=False)
    writer = _SceneWriter(job[0], tables, *job[1:])
    infos = writer.write()
    return tables.rows, infos, writer.db_entries


def generate_nuscenes(cfg: NuScenesSyntheticConfig, progress: bool = True,
                      workers: int = 1) -> Dict[str, object]:
    """Write the dataset described by ``cfg``.

    Args:
        cfg: what to write.
        progress: show a tqdm progress bar (frames).
        workers: processes writing scenes in parallel; the output does not depend on it.

    Returns:
        dict: paths of the written ``train``/``val`` info files and the ``tables``
        folder; ``frames_per_s``, the generation speed.
    """
    from tqdm import tqdm
    cfg.validate()
    start = time.perf_counter()
    if workers < 1:
        raise ValueError(f'workers={workers}: must be >= 1')
    write_marker(cfg.out_dir, 'nuscenes',
                 {k: v for k, v in vars(cfg).items() if k not in ('out_dir', 'overwrite')})
    jobs = []
    for split, n in (('train', cfg.train_frames), ('val', cfg.val_frames)):
        first_idx = 0
        for scene_idx, (name, n_samples) in enumerate(
                _split_scenes(cfg.version, split, n, cfg.samples_per_scene)):
            jobs.append((cfg, split, scene_idx, len(jobs), name, n_samples, first_idx))
            first_idx += n_samples
    bar = tqdm(total=cfg.train_frames + cfg.val_frames, desc='synthetic nuScenes',
               unit='frame', disable=not progress)
    tables = _Tables(cfg.seed)
    infos: Dict[str, List[dict]] = {'train': [], 'val': []}
    db_infos: Dict[str, List[dict]] = {}

    def merge(job: tuple, result: tuple) -> None:
        # the round trip a worker's result takes: same pickle bytes for any `workers`
        rows, scene_infos, db_entries = pickle.loads(pickle.dumps(result))
        tables.extend(rows)
        infos[job[1]].extend(scene_infos)
        for entry in db_entries:  # each object its own group, numbered in order
            entry['group_id'] = sum(map(len, db_infos.values()))
            db_infos.setdefault(entry['name'], []).append(entry)

    if workers == 1:
        for job in jobs:  # in-process: the bar moves frame by frame
            rows = _Tables(cfg.seed, static=False)
            writer = _SceneWriter(cfg, rows, *job[1:])
            scene_infos = writer.write(lambda: bar.update(1))
            merge(job, (rows.rows, scene_infos, writer.db_entries))
    else:
        import multiprocessing as mp
        with mp.get_context('spawn').Pool(workers) as pool:
            for job, result in zip(jobs, pool.imap(_write_scene, jobs)):
                merge(job, result)
                bar.update(job[5])
    bar.close()
    out = {}
    for split, split_infos in infos.items():
        path = osp.join(cfg.out_dir, f'nuscenes_infos_{split}.pkl')
        with atomic_writer(path) as f:  # a reader sees the old file or the new one
            pickle.dump(dict(metainfo=_metainfo(cfg.version), data_list=split_infos), f,
                        protocol=4)
        out[split] = path
    if cfg.gt_database:
        out['gt_database'] = osp.join(cfg.out_dir, 'nuscenes_dbinfos_train.pkl')
        with atomic_writer(out['gt_database']) as f:
            pickle.dump(db_infos, f, protocol=4)
    tables.add_maps()
    tables.dump(cfg.out_dir, cfg.version)
    out['tables'] = osp.join(cfg.out_dir, cfg.version)
    mark_complete(cfg.out_dir, 'nuscenes')  # last: an interrupted run leaves it incomplete
    frames = cfg.train_frames + cfg.val_frames
    out['frames_per_s'] = round(frames / (time.perf_counter() - start), 2)
    return out
