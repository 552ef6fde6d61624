"""patches/speed/stack_query_group.py: StackQueryAndGroup without host reads, same outputs.

Runs on the CPU through point_ops_cpu's ball query and grouping twins (on a GPU through
mmcv's ops and the grouping_backward patch: the same module-level names)."""
import pytest
import torch
from mmdet3d.models.layers.pointnet_modules.stack_point_sa_module import \
    StackQueryAndGroup

import mmdet3d_scaling  # noqa: F401  (applies the patches)
from mmdet3d_scaling.patches.speed import stack_query_group as patch
from mmdet3d_scaling.patches import patching
from mmdet3d_scaling.diagnostics.host_reads import HostReadCensus

ORIGINAL = patch.forward.original


def _case(counts, centre_counts, channels, seed):
    gen = torch.Generator().manual_seed(seed)
    xyz = torch.rand(sum(counts), 3, generator=gen) * 4
    # some centres far from every point: their balls are empty
    new_xyz = torch.rand(sum(centre_counts), 3, generator=gen) * 6
    features = (torch.randn(sum(counts), channels, generator=gen)
                if channels else None)
    as_int = dict(dtype=torch.int32)
    return (xyz, torch.tensor(counts, **as_int), new_xyz,
            torch.tensor(centre_counts, **as_int), features)


def _run(fn, group, case):
    xyz, cnt, new_xyz, new_cnt, features = case
    leaves = [t.clone().requires_grad_() if t is not None else None
              for t in (xyz, new_xyz, features)]
    out, idx = fn(group, leaves[0], cnt, leaves[1], new_cnt, leaves[2])
    out.mul(torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return out.detach(), idx, [t.grad if t is not None else None for t in leaves]


def test_the_patch_is_in_place():
    assert StackQueryAndGroup.forward is patch.forward
    assert patching.apply(['stack_query_group']) == []  # applied once; the original stays
    assert patch.forward.original is ORIGINAL


@pytest.mark.parametrize('counts,centre_counts', [((40, 25), (10, 7)), ((60,), (16,)),
                                                  ((30, 0, 20), (5, 3, 6))])
# no features without xyz is an error: test_no_features_without_xyz_is_an_error
@pytest.mark.parametrize('channels,use_xyz', [(0, True), (6, True), (6, False)])
@pytest.mark.parametrize('seed', [0, 1])
def test_same_outputs_and_gradients_as_mmdet3d(counts, centre_counts, channels, use_xyz,
                                               seed):
    group = StackQueryAndGroup(radius=0.8, sample_nums=8, use_xyz=use_xyz)
    case = _case(counts, centre_counts, channels, seed)
    ours, theirs = _run(patch.forward, group, case), _run(ORIGINAL, group, case)
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])
    for a, b in zip(ours[2], theirs[2]):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b)
    idx = ours[1]
    assert (idx >= 0).all()


def test_some_balls_are_empty():
    """The cases above do exercise the empty-ball zeroing."""
    from mmdet3d.models.layers.pointnet_modules import stack_point_sa_module as sa
    xyz, cnt, new_xyz, new_cnt, _ = _case((40, 25), (10, 7), 0, 0)
    idx = sa.ball_query(0, 0.8, 8, xyz, new_xyz, cnt, new_cnt)
    assert (idx[:, 0] == -1).any() and (idx[:, 0] != -1).any()


def test_no_host_read():
    group = StackQueryAndGroup(radius=0.8, sample_nums=8, use_xyz=True)
    case = _case((40, 25), (10, 7), 6, 0)
    counts = []
    for fn in (patch.forward, ORIGINAL):
        with HostReadCensus() as census:
            fn(group, *case)
        counts.append(census.total)
    assert counts[0] == 0 and counts[1] >= 2, counts


def test_counts_that_do_not_add_up_fail_with_the_message():
    group = StackQueryAndGroup(radius=0.8, sample_nums=8)
    xyz, cnt, new_xyz, new_cnt, features = _case((40, 25), (10, 7), 6, 0)
    with pytest.raises(RuntimeError, match='xyz holds 65 points'):
        patch.forward(group, xyz, torch.tensor([40, 20], dtype=torch.int32), new_xyz,
                     new_cnt, features)


def test_no_features_without_xyz_is_an_error():
    group = StackQueryAndGroup(radius=0.8, sample_nums=8, use_xyz=False)
    xyz, cnt, new_xyz, new_cnt, _ = _case((40, 25), (10, 7), 0, 0)
    with pytest.raises(ValueError, match='use_xyz=False needs point features'):
        patch.forward(group, xyz, cnt, new_xyz, new_cnt, None)
