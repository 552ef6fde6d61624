"""Device memory the CUDA driver keeps for kernels' local memory, outside PyTorch.

A kernel's per-thread local memory (its stack and the arrays it spills) comes from one
allocation per context that the driver sizes for the hungriest kernel launched so far,
per-thread bytes x every thread the device can hold at once, and keeps (CUDA 11 made
that the default). ``torch.cuda.memory_reserved`` does not count it and the caching
allocator cannot use it. mmcv 2.1.0's index kernel of a strided sparse convolution
(``prepareIndicePairsKernel``) holds a 4096 x 4 int array a thread, 64 KiB: after one
forward of mmdet3d's ``SparseEncoder`` on mmcv's ops the driver kept 16.5 GiB of an H100
(132 SMs x 2048 threads x 64 KiB; ``benchmarks/mmcv_local_memory.py``). With spconv 2.x
installed mmdet3d does not run that kernel. Setting the stack-size limit back to CUDA's
default gives the memory back; the next such launch takes it again.
"""
import ctypes
import functools
from typing import Optional

import torch

CU_LIMIT_STACK_SIZE = 0  # CUlimit of cuCtxGetLimit / cuCtxSetLimit
DEFAULT_STACK_BYTES = 1024  # CUDA's default per-thread stack size


@functools.lru_cache(maxsize=None)
def _driver() -> Optional[ctypes.CDLL]:
    try:
        return ctypes.CDLL('libcuda.so.1')
    except OSError:  # no NVIDIA driver on this machine
        return None


def stack_size_bytes() -> Optional[int]:
    """Per-thread local memory the current CUDA context holds now (bytes), or None
    without a driver or a context (the CPU, a process that has not used CUDA)."""
    driver = _driver()
    if driver is None or not torch.cuda.is_initialized():
        return None
    value = ctypes.c_size_t()
    if driver.cuCtxGetLimit(ctypes.byref(value), CU_LIMIT_STACK_SIZE) != 0:
        return None
    return int(value.value)


def kept_bytes(device: Optional[torch.device] = None) -> Optional[int]:
    """Device memory the driver keeps for local memory now (bytes), or None as above:
    per-thread size x the threads the device holds at once."""
    per_thread = stack_size_bytes()
    if per_thread is None:
        return None
    props = torch.cuda.get_device_properties(device or torch.cuda.current_device())
    return per_thread * props.multi_processor_count * props.max_threads_per_multi_processor


def release() -> bool:
    """Give the kept local memory back (waits for the device first); False where there
    is nothing to give back or the driver refused."""
    driver = _driver()
    if driver is None or not torch.cuda.is_initialized():
        return False
    torch.cuda.synchronize()
    return driver.cuCtxSetLimit(CU_LIMIT_STACK_SIZE, ctypes.c_size_t(DEFAULT_STACK_BYTES)) == 0
