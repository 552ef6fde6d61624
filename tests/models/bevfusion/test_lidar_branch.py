"""LiDAR branch of BEVFusion: voxelization, sparse encoder, sparse-conv weight layouts."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mmdet3d_scaling.models.bevfusion import sparse_backend as sb
from mmdet3d_scaling.models.bevfusion.voxelize import BEVFusionVoxelizer

from .common import GRID, PCR, VOXEL, build, tiny_encoder_cfg, toy_batch

spconv = pytest.importorskip('spconv.pytorch')


def _reference_voxelize(points: np.ndarray, voxel, pcr, max_points, max_voxels):
    """Upstream's hard voxelization, written out: first come, first kept."""
    grid = np.round((np.array(pcr[3:]) - pcr[:3]) / voxel).astype(int)
    index, feats, counts, coords = {}, [], [], []
    for p in points:
        c = np.floor((p[:3] - np.float32(pcr[:3])) / np.float32(voxel)).astype(int)
        if (c < 0).any() or (c >= grid).any():
            continue
        key = tuple(c)
        if key not in index:
            if len(index) >= max_voxels:
                continue
            index[key] = len(index)
            feats.append([])
            coords.append(key)
        v = index[key]
        if len(feats[v]) < max_points:
            feats[v].append(p)
    means = np.stack([np.mean(f, axis=0) for f in feats])
    return means, np.array(coords), np.array([len(f) for f in feats])


def test_voxelizer_matches_upstream_semantics():
    rng = np.random.default_rng(0)
    # clustered points so that voxels overflow max_num_points, a few out of range
    centres = rng.uniform(-3, 3, (40, 3))
    pts = np.concatenate([c + rng.normal(0, 0.05, (30, 3)) for c in centres])
    pts = np.c_[pts, rng.uniform(0, 1, (len(pts), 2))].astype(np.float32)
    pcr, voxel = [-2.0, -2.0, -2.0, 2.0, 2.0, 2.0], [0.2, 0.2, 0.2]
    layer = BEVFusionVoxelizer(voxel, pcr, max_num_points=4, max_voxels=(25, 30))
    layer.train()
    feats, coords, sizes = layer([torch.from_numpy(pts), torch.from_numpy(pts[::-1].copy())])
    ref_feats, ref_coords, ref_sizes = _reference_voxelize(pts, voxel, pcr, 4, 25)
    n = len(ref_coords)
    assert n == 25  # max_voxels (train) reached
    assert torch.equal(coords[:n, 0], torch.zeros(n, dtype=torch.int32))
    assert torch.equal(coords[n:, 0], torch.ones(len(coords) - n, dtype=torch.int32))
    np.testing.assert_array_equal(coords[:n, 1:].numpy(), ref_coords)  # (x, y, z)
    np.testing.assert_array_equal(sizes[:n].numpy(), ref_sizes)
    np.testing.assert_allclose(feats[:n].numpy(), ref_feats, rtol=1e-5, atol=1e-6)
    assert (sizes <= 4).all() and sizes.max() == 4

    layer.eval()  # test-time max_voxels
    assert len(layer([torch.from_numpy(pts)])[1]) == 30


def test_voxelizer_bad_config():
    with pytest.raises(ValueError, match='max_num_points'):
        BEVFusionVoxelizer(VOXEL, PCR, max_num_points=-1)
    with pytest.raises(ValueError, match='point_cloud_range'):
        BEVFusionVoxelizer(VOXEL, PCR[:4], max_num_points=10)


def _encode_batch(encoder, seed=0):
    batch = toy_batch(seed)
    voxelizer = BEVFusionVoxelizer(VOXEL, PCR, max_num_points=10, max_voxels=20000)
    feats, coords, _ = voxelizer(batch['inputs']['points'])
    return encoder(feats, coords, 2), coords


def test_sparse_encoder_shapes_and_gradients():
    encoder = build(tiny_encoder_cfg('spconv'))
    encoder.train()
    bev, _ = _encode_batch(encoder)
    # (X, Y, Z) = (128, 128, 41) -> stride 8 in x, y; z: 41 -> 21 -> 11 -> 5 -> 2
    assert bev.shape == (2, 32 * 2, GRID[0] // 8, GRID[1] // 8)
    assert torch.isfinite(bev).all() and bev.abs().sum() > 0
    bev.pow(2).mean().backward()
    no_grad = [n for n, p in encoder.named_parameters()
               if p.grad is None or p.grad.abs().sum() == 0]
    assert not no_grad, no_grad


def test_sparse_encoder_bev_is_x_major():
    """A single occupied voxel at large x, small y lands at [x // 8, y // 8]."""
    encoder = build(tiny_encoder_cfg('spconv')).eval()
    coords = torch.tensor([[0, 100, 10, 20]], dtype=torch.int32)
    bev = encoder(torch.ones(1, 5), coords, 1)
    active = torch.nonzero(bev.abs().sum(1)[0])
    assert len(active) > 0
    assert (active[:, 0] >= 11).all() and (active[:, 1] <= 2).all(), active


def test_sparse_encoder_conv_module_blocks():
    cfg = tiny_encoder_cfg('spconv')
    cfg.update(block_type='conv_module', encoder_channels=((8, ), (16, 16), (32, 32)),
               encoder_paddings=((1, ), (1, 1), ((1, 1, 0), 1)), output_channels=16)
    encoder = build(cfg)
    names = dict(encoder.named_parameters())
    assert 'encoder_layers.encoder_layer2.0.0.weight' in names  # strided conv first
    feats = torch.rand(50, 5)
    coords = torch.cat([torch.zeros(50, 1, dtype=torch.int32),
                        torch.randint(0, 40, (50, 3), dtype=torch.int32)], 1)
    out = encoder(feats, coords, 1)
    # z: 41 -> 41 -> 21 -> 10 (no z padding) -> conv_out 4; x, y: 128 / 4
    assert out.shape == (1, 16 * 4, 32, 32)


@pytest.mark.parametrize('kwargs, match', [
    (dict(sparse_shape=[128, 128]), 'sparse_shape'),
    (dict(block_type='bottleneck'), 'block_type'),
    (dict(encoder_paddings=((0, 0, 1), )), 'encoder_paddings'),
    (dict(sparse_backend='torchsparse'), 'sparse_backend'),
    (dict(encoder_channels=((8, 16, 16), (16, 16, 32), (32, 32, 64), (64, 64))),
     'changes channels'),
])
def test_sparse_encoder_bad_config(kwargs, match):
    cfg = tiny_encoder_cfg('spconv')
    cfg.update(kwargs)
    with pytest.raises(ValueError, match=match):
        build(cfg)


# ------------------------------------------------------------------ weight layouts


def test_layout_permutations_round_trip():
    w = torch.randn(7, 3, 1, 5, 4)  # spconv: out=7, kernel (3, 1, 5), in=4
    m = sb.to_layout(w, sb.SPCONV, sb.MMCV)
    assert m.shape == (3, 1, 5, 4, 7)
    assert torch.equal(m[2, 0, 4, 3, 6], w[6, 2, 0, 4, 3])
    assert torch.equal(sb.to_layout(m, sb.MMCV, sb.SPCONV), w)


def _mmcv_encoder():
    """The same encoder on mmcv's sparse conv (built on the CPU; only CUDA runs it)."""
    try:
        return build(tiny_encoder_cfg('mmcv'))
    except ImportError as err:  # pragma: no cover - mmcv without sparse ops
        pytest.skip(f'mmcv sparse conv not importable: {err}')


@pytest.mark.parametrize('src', ['spconv', 'mmcv'])
@pytest.mark.parametrize('dst', ['spconv', 'mmcv'])
def test_state_dict_loads_across_layouts(src, dst):
    source = build(tiny_encoder_cfg('spconv'))
    for p in source.parameters():
        torch.nn.init.normal_(p)
    state = dict(source.state_dict())  # plain dict: no metadata to lean on
    if src == 'mmcv':
        state = sb.convert_state_dict_layout(state, source, 'mmcv')
    target = build(tiny_encoder_cfg('spconv')) if dst == 'spconv' else _mmcv_encoder()
    assert sb.module_layout(dict(sb.iter_sparse_convs(target))['conv_input.0']) == dst
    missing, unexpected = target.load_state_dict(state, strict=True)
    assert not missing and not unexpected
    convs = dict(sb.iter_sparse_convs(target))
    assert len(convs) == len(dict(sb.iter_sparse_convs(source)))
    for name, value in source.state_dict().items():
        loaded = target.state_dict()[name]
        if name.rsplit('.', 1)[0] in convs:
            loaded = sb.to_layout(loaded, dst, 'spconv')
        assert torch.equal(loaded, value), name


def test_ambiguous_shape_uses_metadata_version():
    conv = spconv.SubMConv3d(3, 3, 3, bias=False)
    w = torch.randn(3, 3, 3, 3, 3)
    assert sb.checkpoint_layout(w, conv, version=2) == 'spconv'
    assert sb.checkpoint_layout(w, conv, version=None) == 'spconv'  # the module's own
    assert sb.checkpoint_layout(torch.randn(2, 2), conv) is None


def test_bad_weight_shape_is_reported():
    encoder = build(tiny_encoder_cfg('spconv'))
    state = dict(encoder.state_dict())
    state['conv_input.0.weight'] = torch.randn(8, 3, 3, 3, 4)  # wrong in_channels
    with pytest.raises(RuntimeError, match='conv_input.0.weight'):
        encoder.load_state_dict(state)
    with pytest.raises(ValueError, match='conv_input.0.weight'):
        sb.convert_state_dict_layout(state, encoder, 'mmcv')


def _encode_and_grad(encoder, feats, coords):
    encoder.zero_grad()
    feats = feats.clone().requires_grad_(True)
    bev = encoder(feats, coords, 2)
    (bev * torch.linspace(-1, 1, bev.numel()).view_as(bev)).sum().backward()
    return bev.detach(), feats.grad, encoder.conv_input[0].weight.grad.clone()


def test_spconv_cpu_results_do_not_depend_on_thread_count():
    """spconv 2.3.8's CPU SubMConv3d with 32 channels is wrong with 2 threads; the
    encoder runs its sparse ops single-threaded (forward and backward) and restores
    the thread count afterwards."""
    encoder = build(tiny_encoder_cfg('spconv')).eval()  # stage 3 has 32 channels
    batch = toy_batch(seed=7)
    voxelizer = BEVFusionVoxelizer(VOXEL, PCR, max_num_points=10, max_voxels=20000)
    feats, coords, _ = voxelizer(batch['inputs']['points'])
    single = _encode_and_grad(encoder, feats, coords)  # conftest: 1 thread
    torch.set_num_threads(2)
    multi = _encode_and_grad(encoder, feats, coords)
    assert torch.get_num_threads() == 2  # restored after forward and backward
    for a, b in zip(single, multi):
        assert torch.equal(a, b)


# ------------------------------------------------ dense reference of the encoder


def _dense_conv(x, mask, conv):
    """A sparse conv as a dense conv3d on the zero-filled grid (spconv layout
    [out, kx, ky, kz, in] -> conv3d [out, in, kx, ky, kz]); submanifold convs keep
    the input sites, strided ones activate every site whose window holds one."""
    stride, padding = list(conv.stride), list(conv.padding)
    y = F.conv3d(x, conv.weight.permute(0, 4, 1, 2, 3), stride=stride, padding=padding)
    if not conv.subm:
        mask = F.max_pool3d(mask, list(conv.kernel_size), stride=stride, padding=padding)
    return y * mask, mask


def _dense_bn(bn, x):
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    shape = (1, -1, 1, 1, 1)
    return (x - bn.running_mean.view(shape)) * scale.view(shape) + bn.bias.view(shape)


def _dense_run(module, x, mask):
    from mmdet3d_scaling.models.bevfusion.sparse_encoder import (SparseBasicBlock,
                                                                 SparseSequential)
    if isinstance(module, SparseSequential):
        for child in module:
            x, mask = _dense_run(child, x, mask)
        return x, mask
    if isinstance(module, SparseBasicBlock):
        y, _ = _dense_conv(x, mask, module.conv1)
        y = F.relu(_dense_bn(module.bn1, y)) * mask
        y, _ = _dense_conv(y, mask, module.conv2)
        return F.relu(_dense_bn(module.bn2, y) + x) * mask, mask
    if isinstance(module, sb.sparse_conv_types()):
        return _dense_conv(x, mask, module)
    if isinstance(module, torch.nn.BatchNorm1d):
        return _dense_bn(module, x) * mask, mask
    return module(x) * mask, mask  # ReLU


def test_sparse_encoder_matches_dense_reference():
    """The whole encoder (spconv weights, kernel orientation, strides, paddings, the
    (X, Y, Z) order and the BEV reshape) equals dense convolutions on the grid."""
    torch.manual_seed(0)
    encoder = build(tiny_encoder_cfg('spconv'))
    with torch.no_grad():
        for name, value in encoder.state_dict().items():
            if 'running_var' in name:
                value.uniform_(0.5, 1.5)
            elif 'running_mean' in name:
                value.uniform_(-0.1, 0.1)
    encoder.eval()
    batch = toy_batch(seed=7)
    voxelizer = BEVFusionVoxelizer(VOXEL, PCR, max_num_points=10, max_voxels=20000)
    feats, coords, _ = voxelizer(batch['inputs']['points'])
    c = coords.long()
    x = torch.zeros(2, 5, *GRID)
    mask = torch.zeros(2, 1, *GRID)
    x[c[:, 0], :, c[:, 1], c[:, 2], c[:, 3]] = feats
    mask[c[:, 0], 0, c[:, 1], c[:, 2], c[:, 3]] = 1
    with torch.no_grad():
        x, mask = _dense_run(encoder.conv_input, x, mask)
        x, mask = _dense_run(encoder.encoder_layers, x, mask)
        x, _ = _dense_run(encoder.conv_out, x, mask)
        n, ch, h, w, d = x.shape
        dense = x.permute(0, 1, 4, 2, 3).reshape(n, ch * d, h, w)
        sparse = encoder(feats, coords, 2)
    assert dense.abs().max() > 0
    assert ((sparse - dense).abs().max() / dense.abs().max()) < 1e-5
