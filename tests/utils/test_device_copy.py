"""utils/device_copy.py: host tensors to the GPU and back without waiting for its queue."""
import pytest
import torch

from mmdet3d_scaling.utils.device_copy import HostCopy, to_device
from tests.devices import DEVICES, needs_cuda


def test_to_device_on_the_cpu_is_the_tensor_itself():
    host = torch.arange(5)
    assert to_device(host, 'cpu') is host


@pytest.mark.parametrize('device', DEVICES)
def test_host_copy_holds_the_values_at_construction(device):
    source = torch.linspace(-1, 1, 12, device=device).view(3, 4)
    copy = HostCopy(source)
    source.add_(10)  # later work on the source does not reach the copy
    out = copy.numpy()
    assert out.shape == (3, 4) and out.dtype.name == 'float32'
    assert torch.equal(torch.from_numpy(out), torch.linspace(-1, 1, 12).view(3, 4))


def test_host_copy_detaches():
    source = torch.ones(3, requires_grad=True) * 2
    assert HostCopy(source).numpy().tolist() == [2.0, 2.0, 2.0]


@needs_cuda
@pytest.mark.cuda
def test_neither_direction_waits_for_the_gpu():
    """Under torch's sync debug mode a wait raises: a pageable copy does, ours not."""
    host = torch.arange(1000, dtype=torch.float32)
    device_tensor = torch.randn(2000, 2000, device='cuda')
    to_device(host, 'cuda')  # warm the pinned pool
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode('error')
    try:
        (device_tensor @ device_tensor).sum()  # a queue to wait for
        moved = to_device(host, 'cuda')
        ahead = HostCopy(moved * 2)
        with pytest.raises(RuntimeError, match='synchronizing'):
            host.to('cuda')
    finally:
        torch.cuda.set_sync_debug_mode('default')
    assert torch.equal(torch.from_numpy(ahead.numpy()), host * 2)


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize('dtype', [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_to_device_keeps_the_values_of_any_layout_and_dtype(dtype):
    """NumPy fills the pinned buffer where it holds the dtype; bfloat16 goes by torch."""
    host = (torch.arange(60).view(6, 10).t()[::2] % 7).to(dtype)  # not contiguous
    moved = to_device(host, 'cuda')
    assert moved.dtype == dtype and moved.shape == host.shape
    assert torch.equal(moved.cpu(), host)
