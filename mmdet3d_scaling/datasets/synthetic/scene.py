"""Sample one synthetic LiDAR scene: ground, clutter and class boxes seen from a sensor.

Shared by the dataset writers (:mod:`.kitti`, :mod:`.nuscenes`). Everything is in the
LiDAR frame (x forward, y left, z up, metres); the sensor sits at the origin,
``SensorModel.height`` above a flat ground plane.

What makes the objects learnable:

- each class has its own size prior (Car 3.9 x 1.6 x 1.56 m, ...) and reflectance;
- points lie on the box faces that the sensor can see, with a density that falls
  with range like a spinning LiDAR's (``density * cos(incidence) / range**2``
  points per square metre), so near objects are dense and far ones sparse;
- objects and clutter cast shadows: points behind them are removed and each object's
  ``visibility`` (the fraction of its surface points that survive) is reported;
- clutter (poles, walls, round bushes) shares the scene but has other shapes, sizes
  and reflectance, so a detector must tell it apart.

Every object point is inside its box (noise is clipped to the box), so boxes contain
their points exactly. The only randomness is the ``numpy.random.Generator`` passed in,
and the geometry uses :mod:`.exact` (the same bits on every CPU) instead of numpy's
CPU-dispatched trigonometry, BLAS products and norms.

API (stable; the dataset writers rely on it)::

    scene = sample_scene(rng, KITTI_CLASSES, n_objects=12,
                         area=Area(0, -30, 60, 30), fov_deg=80)
    scene.points       # (N, 4) float32: x, y, z, intensity in [0, 1]
    scene.boxes_lidar  # (M, 7) float32: x, y, z_bottom, l, w, h, yaw
    scene.labels       # (M,) int64 index into scene.class_names
    scene.visibility   # (M,) float32 in [0, 1]
    scene.clutter_boxes, scene.clutter_kinds  # (K, 7) boxes and 'pole'/'wall'/'bush'
"""
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np

from . import exact

__all__ = ['SizePrior', 'SensorModel', 'Area', 'Scene', 'sample_scene',
           'KITTI_CLASSES', 'box_corners_lidar', 'points_in_box_mask',
           'CLUTTER_KINDS', 'clutter_size', 'scan_boxes']


@dataclass(frozen=True)
class SizePrior:
    """Size, reflectance and frequency of one object class.

    Args:
        lwh: mean length, width, height in metres.
        rel_std: relative standard deviation of each dimension. Defaults to 0.06.
        intensity: mean reflectance of the surface in [0, 1]. Defaults to 0.5.
        weight: relative frequency of the class in a scene. Defaults to 1.0.
    """
    lwh: Tuple[float, float, float]
    rel_std: float = 0.06
    intensity: float = 0.5
    weight: float = 1.0


#: KITTI's three evaluated classes, in mmdet3d's 3-class order.
KITTI_CLASSES: Dict[str, SizePrior] = {
    'Pedestrian': SizePrior((0.8, 0.6, 1.73), intensity=0.35, weight=1.0),
    'Cyclist': SizePrior((1.76, 0.6, 1.73), intensity=0.5, weight=1.0),
    'Car': SizePrior((3.9, 1.6, 1.56), intensity=0.75, weight=2.0),
}


@dataclass(frozen=True)
class SensorModel:
    """A spinning LiDAR at the origin.

    Args:
        height: sensor height above the ground plane in metres. Defaults to 1.73
            (KITTI's Velodyne).
        max_range: points farther than this (metres, in the ground plane) are not
            returned. Defaults to 80.
        density: surface points per square metre at 1 m range, facing the sensor;
            falls as ``1 / range**2``. Defaults to 8000.
        ground_points: ground returns per scan over 360 degrees. Defaults to 10000.
        noise: standard deviation of point position noise in metres. Defaults to 0.02.
    """
    height: float = 1.73
    max_range: float = 80.0
    density: float = 8000.0
    ground_points: int = 10000
    noise: float = 0.02


@dataclass(frozen=True)
class Area:
    """Axis-aligned region (LiDAR frame, metres) in which object centres are placed."""
    x_min: float = 0.0
    y_min: float = -40.0
    x_max: float = 70.0
    y_max: float = 40.0
    min_range: float = 4.0


@dataclass
class Scene:
    """One sampled scene (all arrays in the LiDAR frame)."""
    points: np.ndarray  # (N, 4) float32 x, y, z, intensity
    boxes_lidar: np.ndarray  # (M, 7) float32 x, y, z_bottom, l, w, h, yaw
    labels: np.ndarray  # (M,) int64
    class_names: Tuple[str, ...]
    visibility: np.ndarray  # (M,) float32, fraction of surface points not occluded
    ground_z: float = field(default=-1.73)  # ground plane height in the LiDAR frame
    # (K, 7) clutter (poles, walls, bushes) as boxes, e.g. for rendering camera images
    clutter_boxes: np.ndarray = field(default_factory=lambda: np.zeros((0, 7), np.float32))
    clutter_kinds: Tuple[str, ...] = ()  # 'pole', 'wall' or 'bush' for each clutter box


# --------------------------------------------------------------------------- geometry
def box_corners_lidar(box: np.ndarray) -> np.ndarray:
    """(8, 3) corners of one (x, y, z_bottom, l, w, h, yaw) box; 0-3 bottom, 4-7 top."""
    x, y, z, l, w, h, yaw = box[:7]
    sx = np.array([1, 1, -1, -1]) * l / 2
    sy = np.array([1, -1, -1, 1]) * w / 2
    s, c = exact.sincos(yaw)
    xy = np.stack([x + c * sx - s * sy, y + s * sx + c * sy], axis=1)
    bottom = np.concatenate([xy, np.full((4, 1), z)], axis=1)
    top = bottom + np.array([0, 0, h])
    return np.concatenate([bottom, top], axis=0)


def _to_local(xyz: np.ndarray, box: np.ndarray) -> np.ndarray:
    """Points in the box frame (origin at the bottom centre, x along the length)."""
    s, c = exact.sincos(box[6])
    d = xyz[:, :3] - box[:3]
    return np.stack([c * d[:, 0] + s * d[:, 1], -s * d[:, 0] + c * d[:, 1], d[:, 2]], 1)


def _to_world(local: np.ndarray, box: np.ndarray) -> np.ndarray:
    s, c = exact.sincos(box[6])
    x = c * local[:, 0] - s * local[:, 1] + box[0]
    y = s * local[:, 0] + c * local[:, 1] + box[1]
    return np.stack([x, y, local[:, 2] + box[2]], axis=1)


def points_in_box_mask(xyz: np.ndarray, box: np.ndarray, margin: float = 0.0) -> np.ndarray:
    """Boolean mask of points inside ``box`` grown by ``margin`` metres on every side."""
    loc = _to_local(xyz, box)
    l, w, h = box[3:6] / 2 + margin
    return ((np.abs(loc[:, 0]) <= l) & (np.abs(loc[:, 1]) <= w)
            & (loc[:, 2] >= -margin) & (loc[:, 2] <= 2 * h - margin))


def _rects_overlap(a: np.ndarray, b: np.ndarray, margin: float) -> bool:
    """Separating-axis test of two boxes' footprints, each grown by ``margin``."""
    reach = (exact.hypot(a[3], a[4]) + exact.hypot(b[3], b[4])) / 2 + 2 * margin
    if exact.hypot(a[0] - b[0], a[1] - b[1]) > reach:  # bounding circles apart: quick no
        return False
    ca, cb = box_corners_lidar(a)[:4, :2], box_corners_lidar(b)[:4, :2]
    for yaw in (a[6], b[6]):
        s, c = exact.sincos(yaw)
        for axis in (np.array([c, s]), np.array([-s, c])):
            pa, pb = exact.dot(ca, axis), exact.dot(cb, axis)
            if pa.max() + margin < pb.min() - margin or pb.max() + margin < pa.min() - margin:
                return False
    return True


# ----------------------------------------------------------------------- point sampling
def _face_points(rng: np.random.Generator, box: np.ndarray, sensor: SensorModel,
                 intensity: float) -> np.ndarray:
    """Points on the faces of ``box`` that face the sensor, (K, 4) with intensity."""
    l, w, h = box[3:6]
    half = np.array([l / 2, w / 2])
    # (normal axis, sign, face area); faces: +-x (w*h), +-y (l*h), top (l*w)
    faces = [(0, 1, w * h), (0, -1, w * h), (1, 1, l * h), (1, -1, l * h), (2, 1, l * w)]
    sensor_local = _to_local(np.zeros((1, 3)), box)[0]
    chunks: List[np.ndarray] = []
    for axis, sign, area in faces:
        centre = np.array([0.0, 0.0, h / 2])
        centre[axis] = (half[axis] * sign) if axis < 2 else h
        to_sensor = sensor_local - centre
        dist = exact.norm(to_sensor)
        cos_inc = sign * to_sensor[axis] / max(dist, 1e-6)
        if cos_inc <= 0 or dist > sensor.max_range:
            continue
        n = rng.poisson(sensor.density * area * cos_inc / dist ** 2)
        if n == 0:
            continue
        local = np.empty((n, 3))
        local[:, 0] = rng.uniform(-l / 2, l / 2, n)
        local[:, 1] = rng.uniform(-w / 2, w / 2, n)
        local[:, 2] = rng.uniform(0, h, n)
        local[:, axis] = centre[axis]
        chunks.append(local)
    if not chunks:
        return np.zeros((0, 4), np.float32)
    local = np.concatenate(chunks) + rng.normal(0, sensor.noise, (sum(map(len, chunks)), 3))
    # keep every point strictly inside its box: boxes contain their points exactly
    eps = 0.01
    local[:, 0] = np.clip(local[:, 0], -l / 2 + eps, l / 2 - eps)
    local[:, 1] = np.clip(local[:, 1], -w / 2 + eps, w / 2 - eps)
    local[:, 2] = np.clip(local[:, 2], eps, h - eps)
    refl = np.clip(rng.normal(intensity, 0.08, len(local)), 0, 1)
    return np.concatenate([_to_world(local, box), refl[:, None]], axis=1).astype(np.float32)


def _ellipsoid_points(rng: np.random.Generator, box: np.ndarray, sensor: SensorModel,
                      intensity: float) -> np.ndarray:
    """Points on the sensor-facing half of the ellipsoid inscribed in ``box`` (bushes)."""
    l, w, h = box[3:6]
    dist = max(exact.norm(box[:2]), 1.0)
    area = np.pi * (l * h + w * h + l * w) / 3  # rough visible area
    n = rng.poisson(sensor.density * area / dist ** 2)
    if n == 0:
        return np.zeros((0, 4), np.float32)
    u = rng.normal(size=(n, 3))
    u /= exact.norm(u, axis=1)[:, None]
    local = u * np.array([l / 2, w / 2, h / 2]) * 0.98 + np.array([0, 0, h / 2])
    world = _to_world(local, box)
    facing = exact.dot(u, _to_local(np.zeros((1, 3)), box)[0]) - exact.dot(u, local) > 0
    world = world[facing]
    refl = np.clip(rng.normal(intensity, 0.05, len(world)), 0, 1)
    return np.concatenate([world, refl[:, None]], axis=1).astype(np.float32)


def _ground_points(rng: np.random.Generator, sensor: SensorModel) -> np.ndarray:
    """Ground returns: log-uniform range (density ~ 1/r^2), uniform azimuth."""
    n = sensor.ground_points
    r = exact.exp(rng.uniform(exact.log(2.5), exact.log(sensor.max_range), n))
    az = rng.uniform(-np.pi, np.pi, n)
    sin_az, cos_az = exact.sincos(az)
    z = -sensor.height + rng.normal(0, sensor.noise, n)
    refl = np.clip(rng.normal(0.12, 0.05, n), 0, 1)
    return np.stack([r * cos_az, r * sin_az, z, refl], 1).astype(np.float32)


def _shadow_mask(xyz: np.ndarray, box: np.ndarray) -> np.ndarray:
    """Points hidden behind ``box`` as seen from the origin (azimuth/elevation test)."""
    corners = box_corners_lidar(box)
    az_c = exact.arctan2(box[1], box[0])
    wrap = lambda a: (a + np.pi) % (2 * np.pi) - np.pi  # noqa: E731
    d_az = wrap(exact.arctan2(corners[:4, 1], corners[:4, 0]) - az_c)
    r_corner = exact.norm(corners[:4, :2], axis=1)
    z_top = box[2] + box[5]
    # highest elevation of the silhouette's top edge
    elev_top = exact.arctan2(z_top, r_corner.max() if z_top < 0 else r_corner.min())
    p_az = wrap(exact.arctan2(xyz[:, 1], xyz[:, 0]) - az_c)
    p_r = exact.norm(xyz[:, :2], axis=1)
    return ((p_az >= d_az.min()) & (p_az <= d_az.max()) & (p_r > r_corner.min())
            & (exact.arctan2(xyz[:, 2], p_r) < elev_top))


# ------------------------------------------------------------------------- placement
def _place(rng: np.random.Generator, lwh: np.ndarray, area: Area, fov_deg: Optional[float],
           placed: List[np.ndarray], ground_z: float, tries: int = 30) -> Optional[np.ndarray]:
    """A box of size ``lwh`` that overlaps nothing in ``placed``, or None."""
    for _ in range(tries):
        x, y = rng.uniform(area.x_min, area.x_max), rng.uniform(area.y_min, area.y_max)
        if exact.hypot(x, y) < area.min_range:
            continue
        if fov_deg is not None and abs(exact.arctan2(y, x) * (180 / np.pi)) > fov_deg / 2:
            continue
        box = np.array([x, y, ground_z, *lwh, rng.uniform(-np.pi, np.pi)])
        if not any(_rects_overlap(box, other, 0.3) for other in placed):
            return box
    return None


def _clutter_size(rng: np.random.Generator, kind: str) -> np.ndarray:
    if kind == 'pole':
        d = rng.uniform(0.15, 0.35)
        return np.array([d, d, rng.uniform(2.5, 5.0)])
    if kind == 'wall':
        return np.array([rng.uniform(4, 15), rng.uniform(0.2, 0.5), rng.uniform(1.0, 3.0)])
    return np.array([rng.uniform(0.8, 3.0), rng.uniform(0.8, 3.0), rng.uniform(0.5, 1.5)])


_CLUTTER = (('pole', 0.5), ('wall', 0.3), ('bush', 0.08))  # kind, reflectance


def sample_scene(rng: np.random.Generator, classes: Mapping[str, SizePrior], n_objects: int,
                 area: Area = Area(), fov_deg: Optional[float] = None,
                 n_clutter: int = 10, sensor: SensorModel = SensorModel()) -> Scene:
    """Sample one scene.

    Args:
        rng: the only source of randomness (``np.random.default_rng(seed)``).
        classes: class name -> :class:`SizePrior`; labels index this mapping's order.
        n_objects: objects to place; fewer come out when the area is too crowded.
        area: where object and clutter centres go (LiDAR frame, metres).
        fov_deg: if given, centres stay within +-fov/2 degrees of the +x axis
            (a front camera's field of view); None: all around.
        n_clutter: poles, walls and bushes to place (in ``area``, any azimuth).
        sensor: the LiDAR model.

    Returns:
        Scene: points of ground, clutter and objects after occlusion, and the boxes.
    """
    names = tuple(classes)
    weights = np.array([classes[n].weight for n in names], float)
    ground_z = -sensor.height
    placed: List[np.ndarray] = []
    labels: List[int] = []
    for label in rng.choice(len(names), size=n_objects, p=weights / weights.sum()):
        prior = classes[names[label]]
        lwh = np.asarray(prior.lwh) * np.clip(rng.normal(1, prior.rel_std, 3), 0.8, 1.2)
        box = _place(rng, lwh, area, fov_deg, placed, ground_z)
        if box is not None:
            placed.append(box)
            labels.append(int(label))
    n_obj = len(placed)
    clutter: List[Tuple[np.ndarray, str, float]] = []
    for kind_idx in rng.integers(0, len(_CLUTTER), size=n_clutter):
        kind, refl = _CLUTTER[kind_idx]
        box = _place(rng, _clutter_size(rng, kind), area, None, placed, ground_z)
        if box is not None:
            placed.append(box)
            clutter.append((box, kind, refl))

    chunks = [_face_points(rng, b, sensor, classes[names[lab]].intensity)
              for b, lab in zip(placed[:n_obj], labels)]
    for box, kind, refl in clutter:
        sample = _ellipsoid_points if kind == 'bush' else _face_points
        chunks.append(sample(rng, box, sensor, refl))
    ground = _ground_points(rng, sensor)
    on_free_ground = np.ones(len(ground), bool)
    for box in placed:
        on_free_ground &= ~points_in_box_mask(ground[:, :3], box, margin=0.1)
    chunks.append(ground[on_free_ground])

    owner = np.concatenate([np.full(len(c), i) for i, c in enumerate(chunks)])
    points = np.concatenate(chunks)
    keep = np.ones(len(points), bool)
    for i, box in enumerate(placed):
        keep &= ~(_shadow_mask(points[:, :3], box) & (owner != i))
    keep &= exact.norm(points[:, :2], axis=1) <= sensor.max_range

    visibility = np.array([keep[owner == i].mean() if (owner == i).any() else 0.0
                           for i in range(n_obj)], np.float32)
    boxes = np.asarray(placed[:n_obj], np.float32).reshape(-1, 7)
    return Scene(points=points[keep], boxes_lidar=boxes,
                 labels=np.asarray(labels, np.int64), class_names=names,
                 visibility=visibility, ground_z=ground_z,
                 clutter_boxes=np.asarray([c[0] for c in clutter], np.float32).reshape(-1, 7),
                 clutter_kinds=tuple(c[1] for c in clutter))


# --------------------------------------------------------------- scanning given boxes
#: clutter kinds accepted by :func:`scan_boxes` and :func:`clutter_size`.
CLUTTER_KINDS: Tuple[str, ...] = tuple(kind for kind, _ in _CLUTTER)


def clutter_size(rng: np.random.Generator, kind: str) -> np.ndarray:
    """Random (l, w, h) in metres of one clutter item of ``kind`` (see CLUTTER_KINDS)."""
    if kind not in CLUTTER_KINDS:
        raise ValueError(f'unknown clutter kind {kind!r}; use one of {CLUTTER_KINDS}')
    return _clutter_size(rng, kind)


def scan_boxes(rng: np.random.Generator, boxes: np.ndarray, intensities: np.ndarray,
               clutter: List[Tuple[np.ndarray, str]] = (),
               sensor: SensorModel = SensorModel()
               ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scan boxes placed by the caller (e.g. a temporal nuScenes scene) with ``sensor``.

    The point model is :func:`sample_scene`'s (faces that face the sensor, ground,
    shadows), for callers that place objects themselves.

    Args:
        rng: the only source of randomness.
        boxes: (M, 7) object boxes x, y, z_bottom, l, w, h, yaw in the LiDAR frame.
        intensities: (M,) mean reflectance of each object in [0, 1].
        clutter: (box, kind) pairs of unannotated clutter, kind in CLUTTER_KINDS.
        sensor: the LiDAR model.

    Returns:
        tuple: points (N, 4) float32 x, y, z, intensity; owner (N,) int64, the
        index of the object box a point lies on, -1 for clutter and ground;
        visibility (M,) float32, fraction of each object's points not occluded.
    """
    boxes = np.asarray(boxes, np.float64).reshape(-1, 7)
    reflectance = dict(_CLUTTER)
    placed = list(boxes) + [np.asarray(b, np.float64) for b, _ in clutter]
    chunks = [_face_points(rng, b, sensor, float(i)) for b, i in zip(boxes, intensities)]
    for box, kind in clutter:
        sample = _ellipsoid_points if kind == 'bush' else _face_points
        chunks.append(sample(rng, np.asarray(box, np.float64), sensor, reflectance[kind]))
    ground = _ground_points(rng, sensor)
    on_free_ground = np.ones(len(ground), bool)
    for box in placed:
        on_free_ground &= ~points_in_box_mask(ground[:, :3], box, margin=0.1)
    chunks.append(ground[on_free_ground])

    owner = np.concatenate([np.full(len(c), i) for i, c in enumerate(chunks)])
    points = np.concatenate(chunks)
    keep = exact.norm(points[:, :2], axis=1) <= sensor.max_range
    for i, box in enumerate(placed):
        keep &= ~(_shadow_mask(points[:, :3], box) & (owner != i))
    n_obj = len(boxes)
    visibility = np.array([keep[owner == i].mean() if (owner == i).any() else 0.0
                           for i in range(n_obj)], np.float32)
    owner = np.where(owner < n_obj, owner, -1)
    return points[keep], owner[keep].astype(np.int64), visibility
