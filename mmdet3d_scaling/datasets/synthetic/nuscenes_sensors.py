"""The synthetic nuScenes car's sensors: LiDAR and camera calibration, camera rendering.

Frames (as in nuScenes): global (z up, flat ground at z = 0); ego (x forward, y left,
z up, on the ground); LiDAR (x right, y forward, z up: ``lidar2ego`` is a -90 degree yaw
plus the mounting offset); camera (x right, y down, z along the optical axis).
Calibration values are those of the real car, rounded; intrinsics scale with the
image size.
"""
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import cv2
import numpy as np

from . import exact

__all__ = ['CAMERAS', 'LIDAR_TRANSLATION', 'LIDAR_YAW', 'HDL32_ELEVATIONS_DEG',
           'CameraModel', 'camera_models', 'pose_matrix', 'yaw_quaternion',
           'matrix_quaternion', 'box_corners', 'render_camera', 'image_bbox']

LIDAR_TRANSLATION = (0.943713, 0.0, 1.84023)
LIDAR_YAW = -np.pi / 2
#: Velodyne HDL-32E: 32 beams from -30.67 to +10.67 degrees (the ``ring`` column).
HDL32_ELEVATIONS_DEG = np.linspace(-30.67, 10.67, 32)

# channel: (translation in ego, yaw of the optical axis in degrees, focal length in
# pixels at 1600 x 900). Order: mmdet3d's camera order.
CAMERAS: Dict[str, Tuple[Tuple[float, float, float], float, float]] = {
    'CAM_FRONT': ((1.70, 0.016, 1.511), 0.0, 1266.4),
    'CAM_FRONT_RIGHT': ((1.550, -0.493, 1.496), -55.0, 1260.8),
    'CAM_FRONT_LEFT': ((1.521, 0.495, 1.509), 55.0, 1272.6),
    'CAM_BACK': ((0.033, 0.0, 1.573), 180.0, 809.2),
    'CAM_BACK_LEFT': ((1.036, 0.485, 1.566), 110.0, 1256.7),
    'CAM_BACK_RIGHT': ((1.040, -0.481, 1.574), -110.0, 1259.5),
}


def pose_matrix(rotation: np.ndarray, translation: Sequence[float]) -> np.ndarray:
    """4x4 homogeneous transform from a 3x3 rotation and a translation."""
    mat = np.eye(4)
    mat[:3, :3] = rotation
    mat[:3, 3] = translation
    return mat


def yaw_matrix(yaw: float) -> np.ndarray:
    s, c = exact.sincos(yaw)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def yaw_quaternion(yaw: float) -> List[float]:
    """nuScenes quaternion (w, x, y, z) of a rotation by ``yaw`` about z."""
    s, c = exact.sincos(yaw / 2)
    return [float(c), 0.0, 0.0, float(s)]


def matrix_quaternion(rot: np.ndarray) -> List[float]:
    """nuScenes quaternion (w, x, y, z), w >= 0, of a proper 3x3 rotation matrix."""
    m = rot
    tr = np.trace(m)
    if tr > 0:
        s = 2 * np.sqrt(tr + 1)
        q = [s / 4, (m[2, 1] - m[1, 2]) / s, (m[0, 2] - m[2, 0]) / s, (m[1, 0] - m[0, 1]) / s]
    else:
        i = int(np.argmax(np.diag(m)))
        j, k = (i + 1) % 3, (i + 2) % 3
        s = 2 * np.sqrt(1 + m[i, i] - m[j, j] - m[k, k])
        q = [0.0] * 4
        q[0] = (m[k, j] - m[j, k]) / s
        q[1 + i] = s / 4
        q[1 + j] = (m[j, i] + m[i, j]) / s
        q[1 + k] = (m[k, i] + m[i, k]) / s
    q = np.asarray(q) / exact.norm(np.asarray(q, np.float64))
    return [float(v) for v in (q if q[0] >= 0 else -q)]


@dataclass(frozen=True)
class CameraModel:
    """One calibrated camera: ``cam2ego`` (4x4) and ``intrinsic`` (3x3) at (height, width)."""
    channel: str
    cam2ego: np.ndarray
    intrinsic: np.ndarray
    height: int
    width: int


def camera_models(height: int, width: int) -> List[CameraModel]:
    """The six cameras for images of ``height`` x ``width`` pixels."""
    scale = width / 1600.0
    models = []
    for channel, (trans, yaw_deg, focal) in CAMERAS.items():
        sin, cos = exact.sincos(yaw_deg * (np.pi / 180))
        forward = np.array([cos, sin, 0.0])
        right = np.array([sin, -cos, 0.0])
        down = np.array([0.0, 0.0, -1.0])
        rot = np.stack([right, down, forward], axis=1)  # columns: camera axes in ego
        f = focal * scale
        intrinsic = np.array([[f, 0, width * 0.51], [0, f, height * 0.546], [0, 0, 1.0]])
        models.append(CameraModel(channel, pose_matrix(rot, trans), intrinsic, height, width))
    return models


def box_corners(box: np.ndarray) -> np.ndarray:
    """(8, 3) corners of a (x, y, z_bottom, l, w, h, yaw) box; 0-3 bottom, 4-7 top,
    corners 0, 1, 4, 5 on the front (+length) face."""
    x, y, z, l, w, h, yaw = box[:7]
    sx = np.array([1, 1, -1, -1]) * l / 2
    sy = np.array([1, -1, -1, 1]) * w / 2
    s, c = exact.sincos(yaw)
    xy = np.stack([x + c * sx - s * sy, y + s * sx + c * sy], axis=1)
    bottom = np.concatenate([xy, np.full((4, 1), z)], axis=1)
    return np.concatenate([bottom, bottom + np.array([0, 0, h])], axis=0)


# faces as corner indices (counter-clockwise seen from outside) and their name
_FACES = (((0, 1, 5, 4), 'front'), ((2, 3, 7, 6), 'back'), ((1, 2, 6, 5), 'side'),
          ((3, 0, 4, 7), 'side'), ((4, 5, 6, 7), 'top'), ((3, 2, 1, 0), 'bottom'))
_NEAR = 0.1  # metres: faces are clipped at this depth in front of the camera


def _clip_near(poly: np.ndarray) -> np.ndarray:
    """Sutherland-Hodgman clip of a camera-frame polygon (K, 3) to z >= _NEAR."""
    out = []
    for i in range(len(poly)):
        a, b = poly[i], poly[(i + 1) % len(poly)]
        a_in, b_in = a[2] >= _NEAR, b[2] >= _NEAR
        if a_in:
            out.append(a)
        if a_in != b_in:
            t = (_NEAR - a[2]) / (b[2] - a[2])
            out.append(a + t * (b - a))
    return np.asarray(out).reshape(-1, 3)


def _project(points_cam: np.ndarray, intrinsic: np.ndarray) -> np.ndarray:
    uvw = exact.matmul(points_cam, np.asarray(intrinsic, np.float64).T)
    return uvw[:, :2] / uvw[:, 2:3]


def image_bbox(corners_cam: np.ndarray, cam: CameraModel):
    """Pixel bbox (x1, y1, x2, y2) of a box's corners (8, 3, camera frame) clipped to
    the image, or None when no part of the box is in front of the camera and inside."""
    pts = []
    for idx, _ in _FACES:
        clipped = _clip_near(corners_cam[list(idx)])
        if len(clipped):
            pts.append(_project(clipped, cam.intrinsic))
    if not pts:
        return None
    uv = np.concatenate(pts)
    x1, y1 = np.maximum(uv.min(0), 0.0)
    x2 = min(float(uv[:, 0].max()), float(cam.width))
    y2 = min(float(uv[:, 1].max()), float(cam.height))
    if x2 <= x1 or y2 <= y1:
        return None
    return [float(x1), float(y1), x2, y2]


def _background(rng: np.random.Generator, cam: CameraModel) -> np.ndarray:
    """Sky above the horizon, textured asphalt below (RGB uint8)."""
    h, w = cam.height, cam.width
    horizon = int(np.clip(round(cam.intrinsic[1, 2]), 0, h))
    img = np.empty((h, w, 3), np.float32)
    t = np.linspace(0, 1, max(horizon, 1))[:, None]
    img[:horizon] = (np.array([150, 185, 225]) * (1 - t) + np.array([205, 215, 225]) * t)[:, None]
    noise = rng.normal(0, 1, (max(h // 16, 1), max(w // 16, 1))).astype(np.float32)
    noise = cv2.resize(noise, (w, h), interpolation=cv2.INTER_LINEAR)
    img[horizon:] = (np.array([105, 105, 100]) + 10 * noise[horizon:, :, None])
    return img


def render_camera(rng: np.random.Generator, cam: CameraModel, ego2cam: np.ndarray,
                  boxes: np.ndarray, colors: np.ndarray, sun: np.ndarray) -> np.ndarray:
    """Render ``boxes`` (ego frame, x, y, z_bottom, l, w, h, yaw) as shaded solids.

    Faces are filled with their box's RGB colour, shaded by the sun direction (ego
    frame) so that orientation shows; the front face is lighter, so heading shows too.
    Far boxes are drawn first (painter's algorithm), so near boxes occlude far ones.

    Returns:
        np.ndarray: (height, width, 3) uint8 RGB image.
    """
    img = _background(rng, cam)
    order = []
    for i, box in enumerate(boxes):
        centre = exact.matmul(ego2cam[:3, :3], np.array([box[0], box[1], box[2] + box[5] / 2])) \
            + ego2cam[:3, 3]
        if centre[2] > -max(box[3], box[4]):  # possibly in front of the camera
            order.append((exact.norm(centre), i))
    cam_origin_ego = exact.rigid_inverse(ego2cam)[:3, 3]
    for _, i in sorted(order, reverse=True):
        corners = box_corners(boxes[i])
        corners_cam = exact.matmul(corners, ego2cam[:3, :3].T) + ego2cam[:3, 3]
        centre = corners.mean(0)
        for idx, name in _FACES:
            face = corners[list(idx)]
            normal = exact.cross(face[1] - face[0], face[2] - face[1])
            normal /= exact.norm(normal) + 1e-12
            if exact.dot(normal, cam_origin_ego - face.mean(0)) <= 0:
                continue  # back face
            if exact.dot(normal, face.mean(0) - centre) < 0:
                normal = -normal
            clipped = _clip_near(corners_cam[list(idx)])
            if len(clipped) < 3:
                continue
            shade = 0.55 + 0.35 * max(float(exact.dot(normal, sun)), 0.0) \
                + (0.1 if name == 'front' else 0.0)
            uv = np.round(_project(clipped, cam.intrinsic) * 16).astype(np.int32)
            colour = np.clip(colors[i] * shade, 0, 255)
            cv2.fillConvexPoly(img, uv, colour.tolist(), lineType=cv2.LINE_AA, shift=4)
    return np.clip(img, 0, 255).astype(np.uint8)
