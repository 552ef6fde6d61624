"""patches/cpu/kitti_eval_cpu: mmdet3d's KITTI evaluation runs without a CUDA driver."""
import sys

import numpy as np
import pytest

import mmdet3d_scaling  # noqa: F401  (installs the patch)
from mmdet3d_scaling.patches.cpu import kitti_eval_cpu
from mmdet3d_scaling.patches import patching


def _corners(box):
    """Upstream's corner formula (rotate_iou.rbbox_to_corners)."""
    x, y, dx, dy, a = box
    c, s = np.cos(a), np.sin(a)
    cx = np.array([-dx, -dx, dx, dx]) / 2
    cy = np.array([-dy, dy, dy, -dy]) / 2
    return np.stack([c * cx + s * cy + x, -s * cx + c * cy + y], 1)


def _polygon_area(p):
    return 0.5 * abs(np.dot(p[:, 0], np.roll(p[:, 1], 1)) - np.dot(p[:, 1], np.roll(p[:, 0], 1)))


def _cross_z(a, b):
    """z of the cross product of two 2-vectors (numpy 2.5 removed 2-D np.cross)."""
    return a[0] * b[1] - a[1] * b[0]


def test_cross_z_is_the_3d_cross_products_z():
    rng = np.random.default_rng(0)
    for a, b in rng.normal(size=(20, 2, 2)):
        assert _cross_z(a, b) == pytest.approx(np.cross(np.append(a, 0), np.append(b, 0))[2])


def _clip(subject, clip):
    """Sutherland-Hodgman: convex polygon intersection (reference implementation)."""
    def inside(p, a, b):
        return (b[0] - a[0]) * (p[1] - a[1]) - (b[1] - a[1]) * (p[0] - a[0]) >= 0
    if _polygon_area(clip) and _cross_z(clip[1] - clip[0], clip[2] - clip[1]) < 0:
        clip = clip[::-1]
    out = list(subject)
    for i in range(len(clip)):
        a, b = clip[i], clip[(i + 1) % len(clip)]
        inp, out = out, []
        for j in range(len(inp)):
            p, q = inp[j], inp[(j + 1) % len(inp)]
            if inside(q, a, b):
                if not inside(p, a, b):
                    out.append(_intersect(p, q, a, b))
                out.append(q)
            elif inside(p, a, b):
                out.append(_intersect(p, q, a, b))
        if not out:
            return 0.0
    return _polygon_area(np.array(out))


def _intersect(p, q, a, b):
    d1, d2 = q - p, b - a
    t = ((a[0] - p[0]) * d2[1] - (a[1] - p[1]) * d2[0]) / (d1[0] * d2[1] - d1[1] * d2[0])
    return p + t * d1


def test_module_is_replaced():
    module = sys.modules[kitti_eval_cpu.MODULE]
    assert module.rotate_iou_gpu_eval is kitti_eval_cpu.rotate_iou_eval
    assert patching.apply(['kitti_eval_cpu']) == []  # applied once, on import


def test_matches_reference_polygon_clipping():
    rng = np.random.default_rng(0)
    boxes = np.concatenate([rng.uniform(-2, 2, (6, 2)), rng.uniform(0.5, 4, (6, 2)),
                            rng.uniform(-np.pi, np.pi, (6, 1))], 1).astype(np.float32)
    query = np.concatenate([rng.uniform(-2, 2, (5, 2)), rng.uniform(0.5, 4, (5, 2)),
                            rng.uniform(-np.pi, np.pi, (5, 1))], 1).astype(np.float32)
    inter = np.array([[_clip(_corners(b), _corners(q)) for q in query] for b in boxes])
    area_b = (boxes[:, 2] * boxes[:, 3])[:, None]
    area_q = (query[:, 2] * query[:, 3])[None]
    f = kitti_eval_cpu.rotate_iou_cpu_eval
    np.testing.assert_allclose(f(boxes, query, 2), inter, atol=1e-4)
    np.testing.assert_allclose(f(boxes, query, -1), inter / (area_b + area_q - inter), atol=1e-4)
    np.testing.assert_allclose(f(boxes, query, 0), inter / area_q, atol=1e-4)
    np.testing.assert_allclose(f(boxes, query, 1), inter / area_b, atol=1e-4)
    assert f(boxes[:0], query).shape == (0, 5)


def _frame(i):
    """One KITTI annotation dict: a car and a pedestrian, 10-30 m ahead."""
    z = 10.0 + i % 20
    return dict(name=np.array(['Car', 'Pedestrian']), truncated=np.zeros(2),
                occluded=np.zeros(2, int), alpha=np.zeros(2),
                bbox=np.array([[400, 150, 400 + 3000 / z, 150 + 1200 / z],
                               [800, 150, 800 + 600 / z, 150 + 1300 / z]]),
                dimensions=np.array([[3.9, 1.56, 1.6], [0.8, 1.73, 0.6]]),
                location=np.array([[-3.0, 1.6, z], [4.0, 1.6, z + 2]]),
                rotation_y=np.array([0.1 * i, -0.2 * i]), score=np.zeros(2))


@pytest.mark.slow  # >= 4 s on 2 cores (measured)
@pytest.mark.skipif(kitti_eval_cpu._cuda_available(),
                    reason='with a CUDA device the upstream kernel is used')
def test_kitti_eval_runs_on_cpu():
    """The real mmdet3d KITTI evaluation: perfect detections 100 AP, shifted ones 0."""
    from mmdet3d.evaluation import kitti_eval
    gt = [_frame(i) for i in range(50)]  # KITTI's 41 recall points need > 40 objects
    dt = [dict(g, score=np.array([0.5, 0.4]) + i / 100) for i, g in enumerate(gt)]
    _, ap = kitti_eval(gt, dt, ['Car', 'Pedestrian'], eval_types=['bbox', 'bev', '3d'])
    assert ap['KITTI/Car_3D_AP40_moderate_strict'] == pytest.approx(100.0)
    assert ap['KITTI/Pedestrian_BEV_AP40_moderate_strict'] == pytest.approx(100.0)
    shifted = [dict(d, location=d['location'] + np.array([1.5, 0, 0])) for d in dt]
    _, ap = kitti_eval(gt, shifted, ['Car'], eval_types=['bbox', 'bev', '3d'])
    assert ap['KITTI/Car_3D_AP40_moderate_strict'] == pytest.approx(0.0)
    assert ap['KITTI/Car_2D_AP40_moderate_strict'] == pytest.approx(100.0)  # 2D unchanged
