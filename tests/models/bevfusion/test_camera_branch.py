"""BEVFusion camera branch: view transforms, GeneralizedLSSFPN, ConvFuser.

Shapes and gradients at a reduced size; gradient checkpointing / lean pooling /
deterministic pooling change nothing in the outputs; the LiDAR depth map and the
frustum geometry agree with the camera model; state-dict names and shapes of the
official configuration equal mmdet3d's (``tests/data/reference``).
"""
import copy
import json
import math
import os.path as osp

import numpy as np
import pytest
import torch

import mmdet3d_scaling  # noqa: F401  (registers the models)
from mmdet3d.registry import MODELS
from mmengine.registry import DefaultScope

from tests.devices import DEVICES

REFERENCE_JSON = osp.join(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))),
                          'data', 'reference', 'official_bevfusion_state_dict.json')
LIDAR_CAM = 'bevfusion_lidar-cam_voxel0075_second_secfpn_8xb4-cyclic-20e_nus-3d'

# Official camera-branch settings (mmdet3d 1.4's LiDAR-camera config).
OFFICIAL_VIEW_TRANSFORM = dict(
    type='DepthLSSTransform', in_channels=256, out_channels=80, image_size=[256, 704],
    feature_size=[32, 88], xbound=[-54.0, 54.0, 0.3], ybound=[-54.0, 54.0, 0.3],
    zbound=[-10.0, 10.0, 20.0], dbound=[1.0, 60.0, 0.5], downsample=2)
OFFICIAL_NECK = dict(
    type='GeneralizedLSSFPN', in_channels=[192, 384, 768], out_channels=256,
    start_level=0, num_outs=3, norm_cfg=dict(type='BN2d', requires_grad=True),
    act_cfg=dict(type='ReLU', inplace=True),
    upsample_cfg=dict(mode='bilinear', align_corners=False))
OFFICIAL_FUSER = dict(type='ConvFuser', in_channels=[80, 256], out_channels=256)

# Reduced: 32 x 88 images, 4 x 11 features, 6 depth bins, a 12 m grid of 1 m cells.
IMAGE, FEAT = (32, 88), (4, 11)
SMALL_VT = dict(type='DepthLSSTransform', in_channels=8, out_channels=4, image_size=IMAGE,
                feature_size=FEAT, xbound=[-6.0, 6.0, 1.0], ybound=[-6.0, 6.0, 1.0],
                zbound=[-10.0, 10.0, 20.0], dbound=[1.0, 13.0, 2.0], downsample=2)


def camera_rig(batch: int = 2, cams: int = 2):
    """Cameras at the origin looking along +x / -x: (lidar2image, intrinsics,
    cam2lidar) as ``(B, N, 4, 4)`` tensors; image 32 x 88, focal 40 px."""
    K = np.eye(4)
    K[0, 0] = K[1, 1] = 40.0
    K[0, 2], K[1, 2] = 44.0, 16.0
    l2i, ks, c2l = [], [], []
    for n in range(cams):
        yaw = math.pi * n
        fwd = np.array([math.cos(yaw), math.sin(yaw), 0.0])
        right = np.array([math.sin(yaw), -math.cos(yaw), 0.0])
        down = np.array([0.0, 0.0, -1.0])
        cam2lidar = np.eye(4)
        cam2lidar[:3, :3] = np.stack([right, down, fwd], 1)  # camera x, y, z axes
        cam2lidar[:3, 3] = [0.1 * n, 0.0, 0.5]
        lidar2cam = np.linalg.inv(cam2lidar)
        l2i.append(K @ lidar2cam)
        ks.append(K)
        c2l.append(cam2lidar)
    as_t = lambda m: torch.tensor(np.stack(m), dtype=torch.float32).expand(batch, -1, -1, -1)
    return as_t(l2i).clone(), as_t(ks).clone(), as_t(c2l).clone()


def aug_matrices(batch: int = 2, cams: int = 2):
    """A non-trivial image augmentation (resize, crop, flip) and LiDAR augmentation
    (rotation about z, scale, translation)."""
    img = np.eye(4, dtype=np.float32)
    img[:2, :2] = [[-0.9, 0.0], [0.0, 0.9]]
    img[:2, 3] = [85.0, -1.5]
    ang, s = 0.3, 1.05
    lidar = np.eye(4, dtype=np.float32)
    lidar[:3, :3] = s * np.array([[math.cos(ang), -math.sin(ang), 0],
                                  [math.sin(ang), math.cos(ang), 0], [0, 0, 1]])
    lidar[:3, 3] = [0.4, -0.2, 0.1]
    return (torch.tensor(img).expand(batch, cams, 4, 4).clone(),
            torch.tensor(lidar).expand(batch, 4, 4).clone())


def inputs(batch=2, cams=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    img = torch.randn(batch, cams, 8, *FEAT, generator=g)
    points = [torch.rand(300, 5, generator=g) * torch.tensor([16.0, 16, 2, 1, 1]) -
              torch.tensor([8.0, 8, 1, 0, 0]) for _ in range(batch)]
    l2i, ks, c2l = camera_rig(batch, cams)
    img_aug, lidar_aug = aug_matrices(batch, cams)
    return img, points, l2i, ks, c2l, img_aug, lidar_aug


def build(cfg, **overrides):
    cfg = copy.deepcopy(cfg)
    cfg.update(overrides)
    torch.manual_seed(0)
    # in mmdet3d's scope whatever an earlier test in this process left as the default
    # (under pytest-xdist a worker runs other modules' tests first)
    with DefaultScope.overwrite_default_scope('mmdet3d'):
        return MODELS.build(cfg)


@pytest.mark.slow
def test_depth_lss_shapes_and_gradients():
    vt = build(SMALL_VT).train()
    img, *rest = inputs()
    img.requires_grad_()
    out = vt(img, *rest, None)
    assert out.shape == (2, 4, 6, 6)  # 12 x 12 cells, stride-2 downsample
    out.square().sum().backward()
    assert img.grad is not None and img.grad.abs().sum() > 0
    for name in ('dtransform.0.weight', 'depthnet.0.weight', 'depthnet.6.weight',
                 'downsample.0.weight'):
        assert vt.get_parameter(name).grad.abs().sum() > 0, name
    for name in ('dx', 'bx', 'nx', 'frustum'):
        assert vt.get_parameter(name).grad is None


def test_lss_transform_shapes():
    cfg = dict(SMALL_VT, type='LSSTransform', downsample=1)
    vt = build(cfg)
    img, *rest = inputs()
    assert vt(img, *rest, None).shape == (2, 4, 12, 12)
    assert vt.depthnet.weight.shape == (vt.D + 4, 8, 1, 1)


@pytest.mark.slow
@pytest.mark.parametrize('option', [dict(with_cp=True), dict(memory_efficient=True),
                                    dict(deterministic=True),
                                    dict(with_cp=True, memory_efficient=True,
                                         depth_chunk=2)])
def test_options_do_not_change_outputs_or_gradients(option):
    ref_vt, vt = build(SMALL_VT).train(), build(SMALL_VT, **option).train()
    vt.load_state_dict(ref_vt.state_dict())
    results = []
    for model in (ref_vt, vt):
        img, *rest = inputs(seed=1)
        img.requires_grad_()
        out = model(img, *rest, None)
        out.mul(torch.linspace(0, 1, out.numel()).view_as(out)).sum().backward()
        results.append((out, img.grad, model.depthnet[0].weight.grad,
                        model.dtransform[0].weight.grad))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_depth_map_pixels_match_projection():
    """A point straight ahead of camera 0 lands at the principal point (after the
    image augmentation) with its depth; points behind or off-image are dropped."""
    vt = build(SMALL_VT)
    l2i, _, _ = camera_rig(1, 2)
    img_aug = torch.eye(4).expand(1, 2, 4, 4).clone()
    img_aug[0, :, :2, 3] = torch.tensor([-2.0, 1.0])  # crop: shift by (-2, +1) px
    lidar_aug = torch.eye(4).unsqueeze(0)
    # 7 m ahead, 0.3 m left of the axis; then one far above the image
    pts = torch.tensor([[7.0, 0.3, 0.5], [7.0, 0.3, 90.0]])
    depth = vt.lidar_depth_map([pts], l2i, img_aug, lidar_aug, 2)
    assert depth.shape == (1, 2, 1, *IMAGE)
    # u = 44 - 40 * 0.3 / 7 = 42.29, v = 16; the crop shifts by (-2, +1) -> (40, 17).
    # Camera 1 looks the other way.
    assert depth[0, 0, 0, 17, 40] == pytest.approx(7.0)
    assert depth[0, 0].count_nonzero() == 1 and depth[0, 1].count_nonzero() == 0


@pytest.mark.parametrize('device', DEVICES)
def test_last_write_equals_writes_in_order(device):
    """Repeated indices: the last value in input order wins, as a loop writing one
    value at a time; no index at all gives zeros."""
    from mmdet3d_scaling.models.bevfusion.depth_lss import _last_write
    g = torch.Generator().manual_seed(0)
    index = torch.randint(0, 50, (2000, ), generator=g)
    values = torch.rand(2000, generator=g) + 0.5
    expected = torch.zeros(60)
    for i, v in zip(index.tolist(), values):
        expected[i] = v
    out = _last_write(index.to(device), values.to(device), 60)
    assert torch.equal(out.cpu(), expected)
    empty = _last_write(index[:0].to(device), values[:0].to(device), 5)
    assert torch.equal(empty.cpu(), torch.zeros(5))


@pytest.mark.parametrize('device', DEVICES)
def test_depth_map_keeps_the_last_point_of_a_pixel(device):
    """Points on one ray share a pixel: the last in input order is kept, in every run,
    on the CPU and on CUDA (where upstream's single ``index_put_`` keeps an arbitrary
    one); on the CPU the map equals one written point by point."""
    vt = build(SMALL_VT).to(device)
    l2i, _, _ = camera_rig(1, 2)
    eye = torch.eye(4, device=device)
    # from camera 0's centre (0, 0, 0.5): pixel u = 44 - 40 * 0.3 / 7, v = 16 + 40 * 0.2 / 7
    camera, ray = torch.tensor([0.0, 0.0, 0.5]), torch.tensor([7.0, 0.3, -0.2])
    rng = torch.Generator().manual_seed(0)
    scales = torch.rand(64, generator=rng) * 2 + 0.5
    noise = torch.rand(4000, 3, generator=rng) * 20 - 10  # hits pixels many times too
    pts = torch.cat([noise, camera + ray * scales[:, None]]).to(device)
    runs = [vt.lidar_depth_map([pts], l2i.to(device), eye.expand(1, 2, 4, 4),
                               eye.expand(1, 4, 4), 2).cpu() for _ in range(3)]
    assert all(torch.equal(depth, runs[0]) for depth in runs)
    assert float(runs[0][0, 0, 0, 17, 42]) == pytest.approx(7.0 * float(scales[-1]))
    if device == 'cpu':
        assert torch.equal(runs[0], _depth_map_loop(vt.lidar_depth_map, pts, l2i))


def _depth_map_loop(depth_map, pts: torch.Tensor, l2i: torch.Tensor) -> torch.Tensor:
    """The depth map written one point at a time, in input order (on the CPU)."""
    eye = torch.eye(4)
    out = torch.zeros(1, 2, 1, *IMAGE)
    for p in pts:
        one = depth_map([p[None]], l2i, eye.expand(1, 2, 4, 4), eye.expand(1, 4, 4), 2)
        out = torch.where(one != 0, one, out)
    return out


def test_geometry_inverts_the_projection_with_augmentations():
    """Frustum points mapped to (augmented) LiDAR space project back to their pixel
    and depth through lidar2image, img_aug_matrix and lidar_aug_matrix."""
    vt = build(SMALL_VT)
    _, _, l2i, ks, c2l, img_aug, lidar_aug = inputs()
    geom = vt.get_geometry(c2l[..., :3, :3], c2l[..., :3, 3], ks[..., :3, :3],
                           img_aug[..., :3, :3], img_aug[..., :3, 3],
                           lidar_aug[..., :3, :3], lidar_aug[..., :3, 3])
    B, N = 2, 2
    assert geom.shape == (B, N, vt.D, *FEAT, 3)
    pts = geom.reshape(B, N, -1, 3)
    homo = torch.cat([pts, torch.ones_like(pts[..., :1])], -1)
    orig = torch.einsum('bij,bnpj->bnpi', torch.linalg.inv(lidar_aug), homo)
    cam = torch.einsum('bnij,bnpj->bnpi', l2i, orig)
    d = cam[..., 2]
    uv = torch.stack([cam[..., 0] / d, cam[..., 1] / d, torch.ones_like(d)], -1)
    uv = torch.einsum('bnij,bnpj->bnpi', img_aug[..., :3, :3], uv)[..., :2]
    uv = uv + img_aug[..., None, :2, 3]
    expected = vt.frustum.reshape(1, 1, -1, 3).expand(B, N, -1, 3)
    torch.testing.assert_close(uv, expected[..., :2], rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(d, expected[..., 2], rtol=1e-4, atol=1e-4)


def test_pooling_sums_into_the_right_cell():
    """All context of a camera pixel goes to the BEV cell its frustum points fall in."""
    vt = build(SMALL_VT, downsample=1).eval()
    geom = torch.zeros(1, 1, vt.D, *FEAT, 3)
    geom[..., 0] = 2.5  # x = 2.5 m -> cell 8 of [-6, 6) by 1 m
    geom[..., 1] = -5.5  # y = -5.5 m -> cell 0
    geom[0, 0, :, 0, 0, 0] = 40.0  # pixel (0, 0): off the grid
    index = vt.cell_index(geom)
    depth = torch.full((1, vt.D, *FEAT), 1.0 / vt.D)
    context = torch.ones(1, 4, *FEAT)
    vt.depth_and_context = lambda img, d: (depth, context)
    bev = vt._lift_splat(torch.zeros(1, 1, 8, *FEAT), None, index)
    assert bev.shape == (1, 4, 12, 12)
    assert bev[0, 0, 8, 0] == pytest.approx(FEAT[0] * FEAT[1] - 1)
    assert bev.sum() == pytest.approx(4 * (FEAT[0] * FEAT[1] - 1))


def neck_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, c, 16 // s, 32 // s, generator=g)
            for c, s in ((6, 1), (10, 2), (12, 4))]


@pytest.mark.slow
def test_generalized_lss_fpn_shapes_gradients_and_with_cp():
    cfg = dict(OFFICIAL_NECK, in_channels=[6, 10, 12], out_channels=8)
    ref, cp = build(cfg).train(), build(cfg, with_cp=True).train()
    cp.load_state_dict(ref.state_dict())
    results = []
    for neck in (ref, cp):
        xs = [x.requires_grad_() for x in neck_inputs()]
        outs = neck(xs)
        assert [tuple(o.shape) for o in outs] == [(2, 8, 16, 32), (2, 8, 8, 16)]
        sum(o.square().sum() for o in outs).backward()
        results.append([*outs, *(x.grad for x in xs),
                        neck.lateral_convs[0].conv.weight.grad])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b)


def test_conv_fuser():
    fuser = build(dict(OFFICIAL_FUSER, in_channels=[3, 5], out_channels=4))
    out = fuser([torch.randn(1, 3, 6, 6), torch.randn(1, 5, 6, 6)])
    assert out.shape == (1, 4, 6, 6) and (out >= 0).all()
    with pytest.raises(ValueError, match='in_channels'):
        fuser([torch.randn(1, 5, 6, 6), torch.randn(1, 3, 6, 6)])


def test_bad_config_values_raise():
    with pytest.raises(ValueError, match='downsample'):
        build(SMALL_VT, downsample=4)
    with pytest.raises(ValueError, match='in_channels'):
        build(dict(OFFICIAL_NECK, in_channels=[6]))


@pytest.fixture(scope='module')
def reference():
    if not osp.isfile(REFERENCE_JSON):
        pytest.skip(f'{REFERENCE_JSON} not available')
    with open(REFERENCE_JSON) as f:
        return json.load(f)[LIDAR_CAM]


@pytest.mark.parametrize('prefix,cfg,options', [
    ('view_transform.', OFFICIAL_VIEW_TRANSFORM, {}),
    ('view_transform.', OFFICIAL_VIEW_TRANSFORM, dict(with_cp=True)),
    ('img_neck.', OFFICIAL_NECK, {}),
    ('img_neck.', OFFICIAL_NECK, dict(with_cp=True)),
    ('fusion_layer.', OFFICIAL_FUSER, {}),  # ConvFuser has no options
])
def test_official_state_dict_names_and_shapes(reference, prefix, cfg, options):
    module = build(cfg, **options)
    ours = {prefix + k: list(v.shape) for k, v in module.state_dict().items()}
    expected = {k: v for k, v in reference.items() if k.startswith(prefix)}
    assert ours == expected
    if prefix == 'view_transform.':
        sd = module.state_dict()
        assert sd['nx'].tolist() == [360, 360, 1]
        torch.testing.assert_close(sd['dx'], torch.tensor([0.3, 0.3, 20.0]))
        torch.testing.assert_close(sd['bx'], torch.tensor([-53.85, -53.85, 0.0]))
        assert sd['frustum'][5, 31, 87].tolist() == pytest.approx([703.0, 255.0, 3.5])
