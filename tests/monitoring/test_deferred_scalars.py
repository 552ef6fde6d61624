"""DeferredScalars: values come back exactly as .item() reads them, in iteration and
insertion order, the newest iteration held back by drain(before=...)."""
import pytest
import torch

from mmdet3d_scaling.monitoring.deferred_scalars import DeferredScalars

from ..devices import DEVICES


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16, torch.float16])
def test_values_read_as_item_reads_them(device, dtype):
    sink = DeferredScalars()
    values = torch.randn(3, device=device).to(dtype)
    for i, v in enumerate(values):
        sink.add(f'k{i}', v)
    sink.add('number', 2.5)
    sink.seal(7)
    assert sink.drain() == [(7, {'k0': values[0].item(), 'k1': values[1].item(),
                                 'k2': values[2].item(), 'number': 2.5})]


@pytest.mark.parametrize('device', DEVICES)
def test_drain_before_holds_back_the_newest_iteration(device):
    sink = DeferredScalars()
    for it in range(3):
        sink.add('loss', torch.tensor(float(it), device=device))
        sink.seal(it)
    assert sink.drain(before=2) == [(0, {'loss': 0.0}), (1, {'loss': 1.0})]
    assert len(sink) == 1 and sink.drain() == [(2, {'loss': 2.0})]


def test_a_tensor_of_several_values_is_refused():
    with pytest.raises(ValueError, match="'loss': expected one element, got shape"):
        DeferredScalars().add('loss', torch.zeros(2))
