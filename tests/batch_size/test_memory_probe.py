"""CudaMemoryProbe on a real GPU: the peak counts what the caching allocator reserved,
fragmentation included, not only what tensors held (skipped without CUDA)."""
import pytest
import torch

from mmdet3d_scaling.batch_size.memory_probe import CudaMemoryProbe

MiB = 2**20
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')


def test_cpu_only_machine_gets_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip('has CUDA')
    with pytest.raises(RuntimeError, match='ModeledMemoryProbe'):
        CudaMemoryProbe()


@pytest.mark.cuda
@cuda
def test_peak_counts_reserved_memory():
    probe = CudaMemoryProbe()
    probe.release()
    probe.reset()
    base = torch.cuda.memory_reserved()
    # 100 small blocks freed, then one big tensor they cannot serve: reserved memory
    # holds both, allocated memory never did
    small = [torch.empty(3 * MiB, dtype=torch.uint8, device='cuda') for _ in range(100)]
    del small
    big = torch.empty(512 * MiB, dtype=torch.uint8, device='cuda')
    del big
    peak = probe.peak_bytes() - base
    assert peak >= 800 * MiB
    assert torch.cuda.max_memory_allocated() < base + 600 * MiB
    probe.release()
    probe.reset()
    assert probe.peak_bytes() < base + 100 * MiB  # released and reset between trials


@pytest.mark.cuda
@cuda
def test_limit_caps_the_allocator_and_restores_it():
    probe = CudaMemoryProbe()
    probe.release()
    base = torch.cuda.memory_reserved()
    capacity = probe.capacity_bytes()
    with probe.limit(base + 256 * MiB):
        assert probe.capacity_bytes() <= base + 256 * MiB + MiB
        kept = torch.empty(128 * MiB, dtype=torch.uint8, device='cuda')
        with pytest.raises(torch.cuda.OutOfMemoryError):
            torch.empty(256 * MiB, dtype=torch.uint8, device='cuda')
        del kept
    assert probe.capacity_bytes() == capacity
    big = torch.empty(512 * MiB, dtype=torch.uint8, device='cuda')  # cap lifted
    del big
    probe.release()
