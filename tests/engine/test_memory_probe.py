"""CudaMemoryProbe on a real GPU: the peak is what tensors held, not what the caching
allocator kept reserved afterwards (skipped without CUDA)."""
import pytest
import torch

from mmdet3d_scaling.engine.memory_probe import CudaMemoryProbe

MiB = 2**20
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')


def test_cpu_only_machine_gets_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip('has CUDA')
    with pytest.raises(RuntimeError, match='ModeledMemoryProbe'):
        CudaMemoryProbe()


@cuda
def test_peak_is_allocated_memory_not_the_allocator_cache():
    probe = CudaMemoryProbe()
    probe.release()
    # Fill the cache with blocks that cannot serve the trial's one big tensor.
    small = [torch.empty(3 * MiB, dtype=torch.uint8, device='cuda') for _ in range(100)]
    del small
    probe.reset()
    base = torch.cuda.memory_allocated()
    big = torch.empty(512 * MiB, dtype=torch.uint8, device='cuda')
    del big
    peak = probe.peak_bytes() - base
    assert 512 * MiB <= peak < 520 * MiB
    assert torch.cuda.max_memory_reserved() - base >= peak + 200 * MiB  # cache counted
    assert probe.capacity_bytes() > 0
