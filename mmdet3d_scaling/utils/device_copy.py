"""Host tensors to the GPU without waiting for its queue.

A copy from pageable host memory to the GPU (``tensor.to('cuda')``, ``torch.tensor(...,
device='cuda')``, indexing a GPU tensor with a Python list) makes the host wait until
every kernel queued before it has run: the GPU then idles while Python catches up. A
copy from pinned memory with ``non_blocking=True`` is queued like a kernel; torch's
pinned-memory allocator keeps the host buffer until the copy has run. The other way,
:class:`HostCopy` queues a copy to pinned host memory and waits for it only when the
values are needed.
"""
import numpy as np
import torch
from torch import Tensor


# dtypes NumPy holds bit for bit (not bfloat16)
_NUMPY_DTYPES = {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32,
                 torch.int64, torch.float16, torch.float32, torch.float64}


def to_device(host: Tensor, device: torch.device) -> Tensor:
    """``host`` on ``device``: on a GPU pinned, then a non-blocking copy (queued, no
    wait); on the CPU ``host`` itself.

    The copy into pinned memory is NumPy's, on this thread: torch's copy of a large
    tensor wakes its intra-op threads, which a host busy with loader workers schedules
    late (about 15 ms for a 5 MB heatmap on the 16-core GPU machine, call H2).
    """
    device = torch.device(device)
    if device.type != 'cuda':
        return host
    host = host.detach()
    pinned = torch.empty(host.shape, dtype=host.dtype, pin_memory=True)
    if host.dtype in _NUMPY_DTYPES:
        np.copyto(pinned.numpy(), host.numpy())
    else:
        pinned.copy_(host)
    return pinned.to(device, non_blocking=True)


class HostCopy:
    """``tensor`` on its way to pinned host memory: the copy is queued on the current
    stream at construction, and :meth:`numpy` waits for that copy alone (not for what
    was queued after it), so the host can work on the values while the GPU goes on.

    Args:
        tensor (Tensor): the values to copy (detached); a CPU tensor is cloned.
    """

    def __init__(self, tensor: Tensor) -> None:
        tensor = tensor.detach()
        self._done = None
        if tensor.is_cuda:
            self._host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            self._host.copy_(tensor, non_blocking=True)
            self._done = torch.cuda.Event()
            self._done.record()
        else:
            self._host = tensor.clone()

    def numpy(self):
        """The host values as a NumPy array (waits for the copy if it is still queued)."""
        if self._done is not None:
            self._done.synchronize()
        return self._host.numpy()
