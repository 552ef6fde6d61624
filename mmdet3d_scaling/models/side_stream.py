"""One branch of a model on a second CUDA stream, beside the work of the current one.

Why: a branch that waits on the GPU (a size known only there, as in voxelization or
sparse-convolution index building) drains the stream's whole queue at each wait, and
the GPU idles while Python prepares the next kernels. Queued on a stream of its own,
such a branch waits only for its own kernels, while work queued on the current stream
(BEVFusion's camera branch) keeps the GPU busy meanwhile.

The same operations on the same inputs: only their streams differ. The branch starts
from the inputs as queued when :class:`SideStreamBranch` is made (not from work queued
after it), the current stream waits for the branch before its output is used, and the
caching allocator is told which tensors cross (``record_stream``), so no memory is
reused while the other stream may still read it. Autograd runs each backward operation
on its forward's stream and synchronises where a gradient crosses.
"""
from typing import Any, Callable, Dict, Iterator, Sequence

import torch
from torch import Tensor


class SideStreamBranch:
    """Run ``fn`` on ``stream`` from what the current stream has queued so far.

    Made *before* the work the branch should overlap is queued on the current stream;
    :meth:`run` then queues the branch on ``stream``.

    Args:
        device (torch.device): a CUDA device.
        stream (torch.cuda.Stream): the branch's stream on that device.
    """

    def __init__(self, device: torch.device, stream: 'torch.cuda.Stream') -> None:
        self.main = torch.cuda.current_stream(device)
        self.side = stream
        self.inputs_ready = torch.cuda.Event()
        self.inputs_ready.record(self.main)

    def run(self, fn: Callable[[], Any], inputs: Sequence[Tensor]) -> Any:
        """``fn()`` on the side stream; its output (a tensor, or tensors in tuples,
        lists and dicts), ready for the current stream."""
        self.side.wait_event(self.inputs_ready)
        for tensor in inputs:
            tensor.record_stream(self.side)  # read there: not reused before it has
        with torch.cuda.stream(self.side):
            out = fn()
        self.main.wait_stream(self.side)
        for tensor in _tensors(out):
            tensor.record_stream(self.main)  # made there, used here
        return out


def _tensors(out: Any) -> Iterator[Tensor]:
    """The tensors of ``out``, inside tuples, lists and dicts."""
    if isinstance(out, Tensor):
        yield out
    elif isinstance(out, (tuple, list)):
        for item in out:
            yield from _tensors(item)
    elif isinstance(out, dict):
        for item in out.values():
            yield from _tensors(item)


class SideStreams:
    """One side stream per CUDA device, made on first use (no global state)."""

    def __init__(self) -> None:
        self._streams: Dict[torch.device, 'torch.cuda.Stream'] = {}

    def __deepcopy__(self, memo) -> 'SideStreams':
        return SideStreams()  # a copied model makes its own streams

    def branch(self, device: torch.device) -> SideStreamBranch:
        """A :class:`SideStreamBranch` on ``device``'s side stream, from now."""
        device = torch.device(device)
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device)
        return SideStreamBranch(device, self._streams[device])
