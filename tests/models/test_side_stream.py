"""models/side_stream.py: a branch on a second CUDA stream from the inputs queued so
far, its output ready on the current stream."""
import copy

import pytest
import torch

from mmdet3d_scaling.models.side_stream import SideStreams
from tests.devices import needs_cuda


def test_a_copied_model_gets_its_own_streams():
    streams = SideStreams()
    assert isinstance(copy.deepcopy(streams), SideStreams)
    assert copy.deepcopy(streams) is not streams


@needs_cuda
@pytest.mark.cuda
def test_the_branch_result_is_ready_on_the_current_stream():
    x = torch.randn(2048, 2048, device='cuda')
    branch = SideStreams().branch(x.device)
    later = x @ x  # queued on the current stream after the branch was made
    y = branch.run(lambda: (x * 2).sum(0), [x])
    assert branch.side != torch.cuda.current_stream()
    out = (y + later.sum(0)).cpu()  # used on the current stream right away
    torch.testing.assert_close(out, ((x * 2).sum(0) + (x @ x).sum(0)).cpu())


def test_the_tensors_of_an_output_are_found():
    from mmdet3d_scaling.models.side_stream import _tensors
    a, b, c = torch.zeros(1), torch.ones(1), torch.full((1, ), 2.0)
    found = list(_tensors((a, [b, {'c': c}], 'text')))
    assert [id(t) for t in found] == [id(a), id(b), id(c)]


@needs_cuda
@pytest.mark.cuda
def test_one_stream_per_device_kept():
    streams = SideStreams()
    first = streams.branch(torch.device('cuda', 0)).side
    assert streams.branch('cuda:0').side is first
