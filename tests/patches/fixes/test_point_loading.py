"""point_loading: mmdet3d's point loaders name a corrupt or empty point file."""
import numpy as np
import pytest

import mmdet3d_scaling  # noqa: F401  (applies the fixes set)
from mmdet3d_scaling.patches import patching
from mmdet3d_scaling.patches.fixes.point_loading import (CorruptPointCloudError,
                                                  EmptyPointCloudError)


def _load_file(path: str, load_dim: int = 4):
    from mmdet3d.datasets.transforms import LoadPointsFromFile
    loader = LoadPointsFromFile(coord_type='LIDAR', load_dim=load_dim, use_dim=load_dim)
    return loader(dict(lidar_points=dict(lidar_path=path)))['points']


def test_zero_byte_point_file_is_named(tmp_path):
    empty = tmp_path / '000007.bin'
    empty.write_bytes(b'')
    with pytest.raises(EmptyPointCloudError, match='000007.bin is empty') as err:
        _load_file(str(empty))
    assert isinstance(err.value, CorruptPointCloudError)  # callers catching it still do
    assert 'create_synthetic_data.py' in str(err.value)


def test_zero_byte_sweep_is_named(tmp_path):
    from mmdet3d.datasets.transforms import LoadPointsFromMultiSweeps
    from mmdet3d.structures import LiDARPoints
    sweep = tmp_path / 'sweep.pcd.bin'
    sweep.write_bytes(b'')
    key = LiDARPoints(np.zeros((3, 5), np.float32), points_dim=5)
    results = dict(points=key, timestamp=1.0, lidar_sweeps=[dict(
        timestamp=0.95, lidar_points=dict(lidar_path=str(sweep),
                                          lidar2sensor=np.eye(4).tolist()))])
    with pytest.raises(EmptyPointCloudError, match='sweep.pcd.bin'):
        LoadPointsFromMultiSweeps(sweeps_num=1, test_mode=True)(results)


def test_truncated_and_valid_files(tmp_path):
    good = tmp_path / 'good.bin'
    np.arange(12, dtype=np.float32).tofile(good)
    assert _load_file(str(good)).shape == (3, 4)
    bad = tmp_path / 'bad.bin'
    np.arange(10, dtype=np.float32).tofile(bad)
    with pytest.raises(CorruptPointCloudError, match='load_dim=4') as err:
        _load_file(str(bad))
    assert not isinstance(err.value, EmptyPointCloudError) and 'bad.bin' in str(err.value)


def test_upstream_trains_on_an_empty_file_silently(tmp_path):
    """Why the patch exists: without it the empty frame loads as zero points."""
    empty = tmp_path / 'empty.bin'
    empty.write_bytes(b'')
    reverted = patching.revert(['point_loading'])
    try:
        assert reverted == ['point_loading']
        assert len(_load_file(str(empty))) == 0
    finally:
        patching.apply(reverted)


def test_file_cut_inside_a_value_is_named_before_numpy_reads_it(tmp_path):
    """`printf abc >> 000005.bin`: upstream fails in np.frombuffer, naming no file."""
    cut = tmp_path / '000005.bin'
    np.arange(8, dtype=np.float32).tofile(cut)
    with open(cut, 'ab') as f:
        f.write(b'abc')
    with pytest.raises(CorruptPointCloudError) as err:
        _load_file(str(cut))
    assert f'point cloud {cut} is 35 bytes, not a multiple of 4 (float32)' in str(err.value)
    reverted = patching.revert(['point_loading'])
    try:
        with pytest.raises(ValueError, match='buffer size must be a multiple of element '
                           'size') as upstream:
            _load_file(str(cut))
        assert str(cut) not in str(upstream.value)
    finally:
        patching.apply(reverted)
