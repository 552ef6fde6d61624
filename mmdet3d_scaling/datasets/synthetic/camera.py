"""Camera side of a synthetic scene: projection, 2D boxes and a simple rendered image.

A camera is given by ``lidar2img`` (4x4: intrinsics @ extrinsics, LiDAR frame to pixel
coordinates times depth) and the image size ``(height, width)``. The image is a flat
sky/ground background with the boxes painted far to near (painter's algorithm), each
class in its own colour and faces shaded by their angle to the camera, so that image
branches of multi-modal models have something consistent with the point cloud to learn.
"""
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from . import exact
from .scene import Scene, box_corners_lidar

__all__ = ['project', 'box_to_2d', 'in_image_mask', 'render_image']

# (corner indices of box_corners_lidar) for the five faces a camera can see
_FACES = ((0, 1, 5, 4), (1, 2, 6, 5), (2, 3, 7, 6), (3, 0, 4, 7), (4, 5, 6, 7))
_CLUTTER_BGR = {'pole': (90, 90, 90), 'wall': (150, 140, 130), 'bush': (40, 110, 40)}


def project(xyz: np.ndarray, lidar2img: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Pixel coordinates (N, 2) and depths (N,) of LiDAR-frame points."""
    hom = exact.matmul(np.concatenate([xyz[:, :3], np.ones((len(xyz), 1))], axis=1),
                       np.asarray(lidar2img, np.float64).T)
    depth = hom[:, 2]
    uv = hom[:, :2] / np.where(np.abs(depth) < 1e-6, 1e-6, depth)[:, None]
    return uv, depth


def in_image_mask(xyz: np.ndarray, lidar2img: np.ndarray,
                  hw: Tuple[int, int]) -> np.ndarray:
    """Points in front of the camera that project inside the image."""
    uv, depth = project(xyz, lidar2img)
    return ((depth > 0) & (uv[:, 0] >= 0) & (uv[:, 0] < hw[1])
            & (uv[:, 1] >= 0) & (uv[:, 1] < hw[0]))


def box_to_2d(box: np.ndarray, lidar2img: np.ndarray,
              hw: Tuple[int, int]) -> Optional[Tuple[np.ndarray, float]]:
    """Image box (x1, y1, x2, y2) clipped to the image and its truncation in [0, 1].

    Returns None when the box is behind the camera or projects outside the image.
    Truncation is the share of the unclipped 2D box that falls outside the image.
    """
    uv, depth = project(box_corners_lidar(box), lidar2img)
    if (depth <= 0.1).any():
        return None
    x1, y1 = uv.min(0)
    x2, y2 = uv.max(0)
    cx1, cy1 = np.clip(x1, 0, hw[1] - 1), np.clip(y1, 0, hw[0] - 1)
    cx2, cy2 = np.clip(x2, 0, hw[1] - 1), np.clip(y2, 0, hw[0] - 1)
    if cx2 - cx1 < 1 or cy2 - cy1 < 1:
        return None
    area = max((x2 - x1) * (y2 - y1), 1e-6)
    truncation = float(np.clip(1 - (cx2 - cx1) * (cy2 - cy1) / area, 0, 1))
    return np.array([cx1, cy1, cx2, cy2], np.float64), truncation


def _faces(boxes: np.ndarray, colours: Sequence[Tuple[int, int, int]],
           lidar2img: np.ndarray, cam_pos: np.ndarray):
    """(depth, polygon, colour) of every box face facing the camera."""
    for box, colour in zip(boxes, colours):
        corners = box_corners_lidar(box)
        centre = corners.mean(0)
        uv, depth = project(corners, lidar2img)
        if (depth <= 0.1).any():
            continue
        for face in _FACES:
            fc = corners[list(face)]
            normal = exact.cross(fc[1] - fc[0], fc[3] - fc[0])
            normal *= np.sign(exact.dot(normal, fc.mean(0) - centre))  # outward
            view = cam_pos - fc.mean(0)
            cos_inc = exact.dot(normal, view) / (exact.norm(normal) * exact.norm(view) + 1e-9)
            if cos_inc <= 0:
                continue
            shade = 0.55 + 0.45 * cos_inc
            bgr = tuple(int(c * shade) for c in colour)
            yield float(exact.norm(view)), np.round(uv[list(face)]).astype(np.int32), bgr


def render_image(scene: Scene, lidar2img: np.ndarray, hw: Tuple[int, int],
                 class_bgr: Dict[str, Tuple[int, int, int]],
                 lidar2cam: np.ndarray) -> np.ndarray:
    """A (H, W, 3) uint8 BGR image of ``scene`` seen by the camera.

    Args:
        scene: the scene to draw.
        lidar2img: 4x4 LiDAR-to-pixel projection.
        hw: image (height, width) in pixels.
        class_bgr: class name -> BGR colour of its boxes.
        lidar2cam: 4x4 LiDAR-to-camera transform (gives the camera position).
    """
    import cv2
    h, w = hw
    img = np.empty((h, w, 3), np.uint8)
    horizon = int(np.clip(project(np.array([[1e4, 0.0, 0.0]]), lidar2img)[0][0, 1], 0, h))
    img[:horizon] = (200, 170, 140)  # sky
    img[horizon:] = (70, 75, 80)  # road
    cam_pos = exact.rigid_inverse(lidar2cam)[:3, 3]
    boxes = np.concatenate([scene.boxes_lidar, scene.clutter_boxes]).reshape(-1, 7)
    colours = [class_bgr[scene.class_names[lab]] for lab in scene.labels]
    colours += [_CLUTTER_BGR.get(kind, (128, 128, 128)) for kind in scene.clutter_kinds]
    faces = sorted(_faces(boxes, colours, lidar2img, cam_pos), key=lambda f: -f[0])
    for _, poly, bgr in faces:
        cv2.fillConvexPoly(img, poly, bgr)
    return img
