"""BEVFusion tests run torch single-threaded.

Their ops are small (a few thousand voxels, tens of channels). On a machine whose
cores are shared, torch's intra-op threads then wait on each other: a 7000 x 16 matmul
took 22 ms with 2 threads under load and 0.6 ms with 1.
"""
import pytest
import torch


@pytest.fixture(autouse=True)
def single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
