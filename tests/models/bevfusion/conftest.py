"""BEVFusion tests run torch single-threaded, in mmdet3d's registry scope.

Their ops are small (a few thousand voxels, tens of channels). On a machine whose
cores are shared, torch's intra-op threads then wait on each other: a 7000 x 16 matmul
took 22 ms with 2 threads under load and 0.6 ms with 1.
"""
import pytest
import torch
from mmengine.registry import DefaultScope


@pytest.fixture(autouse=True)
def single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def mmdet3d_scope():
    """mmdet3d's default scope, whatever an earlier test of this worker left (a Runner
    leaves 'mmengine', and registries then miss mmdet3d's types)."""
    with DefaultScope.overwrite_default_scope('mmdet3d'):
        yield
