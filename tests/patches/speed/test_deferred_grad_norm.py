"""The deferred_grad_norm patch: with a sink in the message hub, norm clipping clips as
mmengine does (same gradients) and hands the norm to the sink instead of reading it;
without one it is upstream's code."""
import pytest
import torch
from mmengine.logging import MessageHub
from mmengine.optim import OptimWrapper

from mmdet3d_scaling.monitoring.deferred_scalars import SINK_INFO, DeferredScalars
from mmdet3d_scaling.patches import patching

from ...devices import DEVICES


def _clipped(device, with_sink):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 3).to(device)
    model(torch.randn(16, 8, device=device)).pow(2).sum().mul(100).backward()
    hub = MessageHub.get_instance(f'deferred-grad-norm-{device}-{with_sink}')
    sink = DeferredScalars()
    if with_sink:
        hub.update_info(SINK_INFO, sink, resumed=False)
    wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1),
                           clip_grad=dict(max_norm=1.0))
    wrapper.message_hub = hub
    wrapper._clip_grad()
    sink.seal(0)
    return [p.grad.clone() for p in model.parameters()], hub, sink


@pytest.mark.parametrize('device', DEVICES)
def test_same_clipping_and_the_norm_goes_to_the_sink(device):
    upstream_grads, upstream_hub, _ = _clipped(device, with_sink=False)
    with patching.scoped(['deferred_grad_norm']):
        grads, hub, sink = _clipped(device, with_sink=True)
        plain_grads, plain_hub, _ = _clipped(device, with_sink=False)
    for a, b, c in zip(upstream_grads, grads, plain_grads):
        torch.testing.assert_close(b, a, rtol=0, atol=0)
        torch.testing.assert_close(c, a, rtol=0, atol=0)
    norm = upstream_hub.get_scalar('train/grad_norm').current()
    assert 'train/grad_norm' not in hub.log_scalars  # not read: handed over
    assert sink.drain() == [(0, {'train/grad_norm': norm})]
    assert plain_hub.get_scalar('train/grad_norm').current() == norm  # no sink: upstream


def test_the_patch_is_selected_by_name_only():
    assert 'deferred_grad_norm' not in patching.resolve(['speed'])
    assert patching.resolve(['deferred_grad_norm']) == ['deferred_grad_norm']
