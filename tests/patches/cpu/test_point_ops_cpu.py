"""PyTorch twins of mmcv's CUDA-only point ops against literal transcriptions of the
CUDA kernels (mmcv 2.1.0 csrc/common/cuda/*_kernel.cuh), and their installation."""
import importlib

import pytest
import torch

import mmdet3d_scaling  # noqa: F401  (applies the patch)
from mmdet3d_scaling.patches.cpu import point_ops_cpu as ops
from mmdet3d_scaling.patches import patching


# ------------------------------------------------- kernels, transcribed loop by loop
def fps_kernel(xyz, m):
    batch, n, _ = xyz.shape
    out = torch.zeros(batch, m, dtype=torch.int32)
    for b in range(batch):
        temp = [1e10] * n
        old = 0
        for j in range(1, m):
            best, besti = -1.0, 0
            for k in range(n):
                d = float(((xyz[b, k] - xyz[b, old]) ** 2).sum())
                temp[k] = min(d, temp[k])
                if temp[k] > best:
                    best, besti = temp[k], k
            old = besti
            out[b, j] = old
    return out


def stack_ball_query_kernel(radius, nsample, xyz, xyz_cnt, new_xyz, new_cnt):
    idx = torch.zeros(new_xyz.shape[0], nsample, dtype=torch.int32)
    for pt in range(new_xyz.shape[0]):
        bs, pt_cnt = 0, 0
        while bs < len(new_cnt):
            pt_cnt += int(new_cnt[bs])
            if pt < pt_cnt:
                break
            bs += 1
        start = int(xyz_cnt[:bs].sum())
        cnt = 0
        for k in range(int(xyz_cnt[bs])):
            d2 = float(((new_xyz[pt] - xyz[start + k]) ** 2).sum())
            if d2 < radius * radius:
                if cnt == 0:
                    idx[pt, :] = k
                idx[pt, cnt] = k
                cnt += 1
                if cnt >= nsample:
                    break
        if cnt == 0:
            idx[pt, 0] = -1
    return idx


def stack_group_kernel(features, feat_cnt, idx, idx_cnt):
    m, nsample = idx.shape
    out = torch.zeros(m, features.shape[1], nsample, dtype=features.dtype)
    for pt in range(m):
        bs, pt_cnt = 0, int(idx_cnt[0])
        for k in range(1, len(idx_cnt)):
            if pt < pt_cnt:
                break
            pt_cnt += int(idx_cnt[k])
            bs = k
        start = int(feat_cnt[:bs].sum())
        end = start + int(feat_cnt[bs])
        for s in range(nsample):
            if start + int(idx[pt, s]) < end:
                out[pt, :, s] = features[start + int(idx[pt, s])]
    return out


# ------------------------------------------------------------------------- the twins
def test_furthest_point_sample_matches_the_kernel():
    gen = torch.Generator().manual_seed(0)
    xyz = torch.rand(2, 60, 3, generator=gen) * 10
    got = ops.furthest_point_sample_cpu(xyz, 12)
    assert got.dtype == torch.int32 and got.shape == (2, 12)
    assert torch.equal(got, fps_kernel(xyz, 12))
    assert all(len(set(row.tolist())) == 12 for row in got)  # distinct points


def _stacked_cloud(gen):
    # 3 samples: 40 points, 0 points, 25 points; centres 7, 3, 0 (and some far away)
    xyz_cnt = torch.tensor([40, 0, 25], dtype=torch.int32)
    new_cnt = torch.tensor([7, 3, 0], dtype=torch.int32)
    xyz = torch.rand(65, 3, generator=gen) * 4
    new_xyz = torch.rand(10, 3, generator=gen) * 4
    new_xyz[5] += 100  # an empty ball in a non-empty sample
    return xyz, xyz_cnt, new_xyz, new_cnt


@pytest.mark.parametrize('nsample', [1, 5, 64])
def test_stack_ball_query_matches_the_kernel(nsample):
    xyz, xyz_cnt, new_xyz, new_cnt = _stacked_cloud(torch.Generator().manual_seed(1))
    got = ops.stack_ball_query_cpu(1.2, nsample, xyz, new_xyz, xyz_cnt, new_cnt)
    want = stack_ball_query_kernel(1.2, nsample, xyz, xyz_cnt, new_xyz, new_cnt)
    assert got.dtype == torch.int32 and torch.equal(got, want)
    assert got[5, 0] == -1 and (got[7:10, 0] == -1).all()  # far centre; empty sample


def test_stack_ball_query_chunks_agree(monkeypatch):
    xyz, xyz_cnt, new_xyz, new_cnt = _stacked_cloud(torch.Generator().manual_seed(2))
    whole = ops.stack_ball_query_cpu(1.0, 8, xyz, new_xyz, xyz_cnt, new_cnt)
    monkeypatch.setattr(ops, '_CHUNK', 2)
    assert torch.equal(ops.stack_ball_query_cpu(1.0, 8, xyz, new_xyz, xyz_cnt, new_cnt),
                       whole)


def test_stack_grouping_matches_the_kernel_and_has_gradients():
    gen = torch.Generator().manual_seed(3)
    feat_cnt = torch.tensor([6, 4], dtype=torch.int32)
    idx_cnt = torch.tensor([3, 2], dtype=torch.int32)
    features = torch.randn(10, 5, generator=gen, dtype=torch.float64)
    idx = torch.randint(0, 4, (5, 3), generator=gen, dtype=torch.int32)
    idx[0, 1] = 7  # beyond the first sample's 6 points: stays 0 as in the kernel
    got = ops.stack_grouping_operation_cpu(features, idx, feat_cnt, idx_cnt)
    assert got.shape == (5, 5, 3)
    assert torch.equal(got, stack_group_kernel(features, feat_cnt, idx, idx_cnt))
    assert (got[0, :, 1] == 0).all()
    leaf = features.clone().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda f: ops.stack_grouping_operation_cpu(f, idx, feat_cnt, idx_cnt), (leaf,))


def test_points_in_boxes_part_gives_the_first_box():
    boxes = torch.tensor([[[0., 0., 0., 2., 2., 2., 0.],    # z from 0 (bottom centre)
                           [1., 0., 0., 2., 2., 2., 0.]]])  # overlaps the first
    points = torch.tensor([[[0.5, 0., 1.], [1.5, 0., 1.], [5., 5., 1.], [0., 0., -1.]]])
    got = ops.points_in_boxes_part_cpu(points, boxes)
    assert got.dtype == torch.int32 and got.tolist() == [[0, 1, -1, -1]]
    assert ops.points_in_boxes_part_cpu(points, boxes[:, :0]).tolist() == [[-1] * 4]


# ----------------------------------------------------------------- the installation
def test_mmdet3d_modules_call_the_dispatchers():
    from mmcv import ops as mmcv_ops
    for module_name, names in ops.TARGETS.items():
        module = importlib.import_module(module_name)
        for name in names:
            op = getattr(module, name)
            assert op._point_ops_cpu and op._upstream is getattr(mmcv_ops, name)
    assert patching.apply(['point_ops_cpu']) == []  # applied once: one wrapper
    module = importlib.import_module(
        'mmdet3d.models.layers.pointnet_modules.stack_point_sa_module')
    assert module.ball_query._upstream is mmcv_ops.ball_query


def test_unsupported_forms_say_so():
    xyz = torch.rand(1, 10, 3)
    with pytest.raises(NotImplementedError, match='stacked ball_query'):
        ops._ball_query_cpu(0, 1.0, 4, xyz, xyz[:, :2].contiguous())
    with pytest.raises(NotImplementedError, match='min_radius=0.5'):
        ops._ball_query_cpu(0.5, 1.0, 4, xyz[0], xyz[0, :2], torch.tensor([10]),
                            torch.tensor([2]))
    with pytest.raises(NotImplementedError, match='stacked grouping_operation'):
        ops._grouping_operation_cpu(xyz[0], torch.zeros(2, 4, dtype=torch.int32))
