"""Host tensors to the GPU without waiting for its queue.

A copy from pageable host memory to the GPU (``tensor.to('cuda')``, ``torch.tensor(...,
device='cuda')``, indexing a GPU tensor with a Python list) makes the host wait until
every kernel queued before it has run: the GPU then idles while Python catches up. A
copy from pinned memory with ``non_blocking=True`` is queued like a kernel; torch's
pinned-memory allocator keeps the host buffer until the copy has run.
"""
import torch
from torch import Tensor


def to_device(host: Tensor, device: torch.device) -> Tensor:
    """``host`` on ``device``: on a GPU pinned, then a non-blocking copy (queued, no
    wait); on the CPU ``host`` itself."""
    device = torch.device(device)
    if device.type != 'cuda':
        return host
    return host.pin_memory().to(device, non_blocking=True)
