"""The devices a test runs on: the CPU always, a CUDA GPU where there is one."""
import pytest
import torch

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU')
DEVICES = ['cpu', pytest.param('cuda', marks=needs_cuda)]


def release_cuda_local_memory() -> None:
    """Give back what the driver keeps for local memory and the allocator's cache, so
    that other test workers and their subprocesses on the same card find the memory:
    mmcv's strided sparse conv alone makes the driver keep 16.5 GiB of an H100
    (``mmdet3d_scaling.utils.cuda_local_memory``); with 8 workers the card ran out and
    mmcv's index building crashed the later processes (calls F2 and G2). Imported here,
    not at the top: the conftest imports this file before any test imports the plugin."""
    from mmdet3d_scaling.utils import cuda_local_memory
    cuda_local_memory.release()
    torch.cuda.empty_cache()
