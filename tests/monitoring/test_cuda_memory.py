"""CudaMemory on a real CUDA device (skipped without one)."""
import pytest
import torch

from mmdet3d_scaling.monitoring.cuda_memory import MB, CudaMemory

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')]


def test_peak_survives_a_counter_reset():
    device = torch.device('cuda', torch.cuda.current_device())
    memory = CudaMemory(device)
    base = torch.cuda.memory_allocated(device) / MB  # what earlier tests left allocated
    torch.cuda.reset_peak_memory_stats(device)
    spike = torch.empty(64 * MB, dtype=torch.uint8, device=device)
    del spike
    memory.fold_peak()
    torch.cuda.reset_peak_memory_stats(device)  # what mmengine's LogProcessor does
    figures = memory.figures(reset_counter=True)
    assert figures['mem_peak_mb'] >= base + 64
    assert figures['mem_alloc_mb'] < base + 64
    memory.restart()
    assert memory.figures(reset_counter=False)['mem_peak_mb'] < base + 64


def test_the_drivers_kept_local_memory_is_reported():
    device = torch.device('cuda', torch.cuda.current_device())
    torch.zeros(1, device=device)  # a context, as in any run the monitor watches
    figures = CudaMemory(device).figures(reset_counter=False)
    props = torch.cuda.get_device_properties(device)
    threads = props.multi_processor_count * props.max_threads_per_multi_processor
    assert figures['mem_local_mb'] >= 1024 * threads / MB  # at least CUDA's 1 KiB a thread
