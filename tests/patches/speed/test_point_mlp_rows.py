"""patches/speed/point_mlp_rows.py: StackedSAModuleMSG's point MLPs on rows, the same
outputs, gradients and running statistics as mmdet3d's 1x1 convolutions.

The modules under test are PV-RCNN's own (built from configs/pv_rcnn/
pv_rcnn_synthetic_kitti.py: a VoxelSetAbstraction layer and the RoI grid pool, smaller
inputs); on the CPU the ball query and grouping are point_ops_cpu's twins, on CUDA
mmcv's kernels."""
import copy

import pytest
import torch
from mmengine.config import Config
from mmdet3d.models.layers.pointnet_modules.stack_point_sa_module import \
    StackedSAModuleMSG

import mmdet3d_scaling  # noqa: F401  (registers and applies the default patches)
from mmdet3d_scaling.patches import patching
from mmdet3d_scaling.patches.speed import point_mlp_rows as patch
from tests.devices import DEVICES

CONFIG = 'configs/pv_rcnn/pv_rcnn_synthetic_kitti.py'
ORIGINAL = patch.forward.original


@pytest.fixture(autouse=True)
def full_precision_fp32():
    """cuDNN's convolutions use TF32 by default and matrix products do not (unless a
    config set ``float32_matmul_precision``): both sides in full fp32 here, so the
    comparison measures the patch, not TF32's 10-bit mantissa."""
    matmul = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul


def _sa_configs():
    model = Config.fromfile(CONFIG).model
    vsa = model.points_encoder.voxel_sa_cfgs_list[1]  # two radii, 16 and 32 samples
    grid = model.roi_head.bbox_roi_extractor.roi_layer
    return {'voxel_sa': vsa, 'roi_grid_pool': grid}


def _build(name, **changes):
    cfg = dict(_sa_configs()[name])
    cfg.update(changes)
    cfg.pop('type', None)
    return StackedSAModuleMSG(**cfg)


def _case(module, counts, centre_counts, device, seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    channels = module.mlps[0][0].conv.in_channels - 3  # use_xyz: +3
    xyz = torch.rand(sum(counts), 3, generator=gen) * 6
    new_xyz = torch.rand(sum(centre_counts), 3, generator=gen) * 7  # some empty balls
    features = torch.randn(sum(counts), channels, generator=gen)
    as_int = dict(dtype=torch.int32, device=device)
    return (xyz.to(device, dtype), torch.tensor(counts, **as_int),
            new_xyz.to(device, dtype), torch.tensor(centre_counts, **as_int),
            features.to(device, dtype))


def _run(fn, module, case, train=True):
    module.train(train)
    xyz, cnt, new_xyz, new_cnt, features = case
    features = features.clone().requires_grad_()
    out_xyz, out = fn(module, xyz, cnt, new_xyz, new_cnt, features)
    weights = torch.linspace(-1, 1, out.numel(), device=out.device).view_as(out)
    if train:
        out.mul(weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
    return out_xyz, out.detach(), features.grad, grads, copy.deepcopy(module.state_dict())


# float64 on the CPU: a summation order's rounding is ~1e-16 relative, so a tight
# tolerance leaves no room for a real difference; float32 on CUDA (mmcv's kernels)
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-4}


def _close_in_norm(ours, theirs, name, tol):
    """``|ours - theirs| <= tol |theirs|`` (L2 norms): a summation order's rounding."""
    error = float((ours - theirs).norm())
    assert error <= tol * float(theirs.norm()) + 1e-12, (name, error, float(theirs.norm()))


def _compare(name, case_args, device, train=True, **changes):
    dtype = torch.float64 if device == 'cpu' else torch.float32
    tol = TOLERANCE[dtype]
    torch.manual_seed(0)
    module = _build(name, **changes).to(device, dtype)
    with torch.no_grad():  # BN weights off their initial 1 / 0, as after training
        for m in module.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    twin = copy.deepcopy(module)
    case = _case(module, *case_args, device=device, seed=0, dtype=dtype)
    ours = _run(patch.forward, module, case, train)
    theirs = _run(ORIGINAL, twin, case, train)
    assert torch.equal(ours[0], theirs[0])
    torch.testing.assert_close(ours[1], theirs[1], rtol=tol, atol=tol)
    if train:
        _close_in_norm(ours[2], theirs[2], 'features', tol)
        assert ours[3].keys() == theirs[3].keys() and ours[3]
        for key in ours[3]:  # sums over every row: compared as whole tensors
            _close_in_norm(ours[3][key], theirs[3][key], key, tol)
    for key, value in theirs[4].items():  # running statistics, num_batches_tracked
        torch.testing.assert_close(ours[4][key], value, rtol=tol, atol=tol)
    return ours


def test_the_patch_is_declared_in_the_speed_set():
    assert 'point_mlp_rows' in patching.resolve(['speed'])
    assert ORIGINAL is not patch.forward


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('name,counts,centres', [
    ('voxel_sa', (300, 200), (40, 30)),
    ('roi_grid_pool', (150, 250, 100), (54, 27, 81)),
])
def test_same_as_mmdet3d_in_training(name, counts, centres, device):
    ours = _compare(name, (counts, centres), device)
    assert ours[1].shape == (sum(centres), sum(
        mlp[-1].conv.out_channels for mlp in _build(name).mlps))


@pytest.mark.parametrize('device', DEVICES)
def test_same_as_mmdet3d_in_eval(device):
    _compare('roi_grid_pool', ((150, 250), (54, 27)), device, train=False)


@pytest.mark.parametrize('device', DEVICES)
def test_average_pooling(device):
    _compare('voxel_sa', ((300, 200), (40, 30)), device, pool_mod='avg')


def test_cumulative_average_momentum():
    """momentum=None: torch's cumulative average of the statistics."""
    _compare('voxel_sa', ((120,), (30,)), 'cpu', norm_cfg=dict(type='BN2d', momentum=None))


def test_other_layers_run_upstream_forward():
    """A norm the patch does not compute on rows (GroupNorm) -> mmdet3d's forward."""
    module = _build('voxel_sa', norm_cfg=dict(type='GN', num_groups=4))
    assert not patch.runs_as_rows(module.mlps[0][0])
    case = _case(module, (100,), (20,), 'cpu', seed=1)
    ours = _run(patch.forward, module, case)
    theirs = _run(ORIGINAL, copy.deepcopy(module), case)
    assert torch.equal(ours[1], theirs[1]) and torch.equal(ours[2], theirs[2])


def test_a_mutated_row_order_fails():
    """The comparison can fail: rows taken channel-major instead of sample-major."""
    def wrong(self, xyz, cnt, new_xyz, new_cnt, features=None):
        grouped, _ = self.groupers[0](xyz, cnt, new_xyz, new_cnt, features)
        m, c, k = grouped.shape
        rows = grouped.reshape(m * k, c)  # wrong: not transposed first
        for layer in self.mlps[0]:
            rows = patch.conv_module_rows(layer, rows)
        return new_xyz, rows.view(m, k, -1).max(dim=1).values
    module = _build('voxel_sa', radius=[0.4], sample_nums=[16], mlp_channels=[[16, 16]])
    case = _case(module, (200,), (30,), 'cpu', seed=2)
    ours = _run(wrong, module, case)[1]
    theirs = _run(ORIGINAL, copy.deepcopy(module), case)[1]
    assert not torch.allclose(ours, theirs, rtol=1e-4, atol=1e-4)
