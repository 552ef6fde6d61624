"""The devices a test runs on: the CPU always, a CUDA GPU where there is one."""
import pytest
import torch

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU')
DEVICES = ['cpu', pytest.param('cuda', marks=needs_cuda)]


def release_cuda_local_memory() -> None:
    """Give back the device memory a kernel's per-thread local memory made the driver keep.

    The driver sizes a context's local memory for the hungriest kernel launched so far and
    keeps it (CUDA 11+), outside torch's allocator. mmcv 2.1.0's strided sparse-conv
    index kernel holds a 4096 x 4 int array a thread (64 KiB), which keeps gigabytes per
    process; with several test workers and their subprocesses on one card, later
    processes then find no memory. Setting the stack-size limit back to CUDA's default
    (1 KiB) frees it; the next such launch takes it again.
    """
    import ctypes
    try:
        driver = ctypes.CDLL('libcuda.so.1')
    except OSError:
        return
    torch.cuda.synchronize()
    driver.cuCtxSetLimit(0, ctypes.c_size_t(1024))  # CU_LIMIT_STACK_SIZE
    torch.cuda.empty_cache()
