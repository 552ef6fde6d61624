"""AmpOptimWrapper on this CPU-only machine: degraded, logged, not asserted."""
import pytest
import torch
from mmengine.optim import AmpOptimWrapper

import mmdet3d_scaling  # noqa: F401
from mmdet3d_scaling.patches.cpu import amp_cpu
from mmdet3d_scaling.patches import patching

pytestmark = pytest.mark.skipif(amp_cpu.accelerator_available(),
                                reason='the patch only acts without an accelerator')


def _wrapper(**kwargs) -> AmpOptimWrapper:
    model = torch.nn.Linear(4, 1)
    return AmpOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                           **kwargs), model


@pytest.mark.parametrize('dtype, autocast', [
    (None, torch.bfloat16), ('float16', torch.bfloat16),
    ('bfloat16', torch.bfloat16), ('float32', None)])
def test_dtype_degrades_on_cpu(dtype, autocast):
    wrapper, model = _wrapper(dtype=dtype, loss_scale=512.)
    assert wrapper.cast_dtype == autocast
    with wrapper.optim_context(model):
        out = model(torch.randn(2, 4))
        assert torch.is_autocast_enabled('cpu') == (autocast is not None)
    assert out.dtype == (autocast or torch.float32)
    wrapper.update_params(out.float().pow(2).mean())  # a full step, scaler disabled


def test_loss_scale_still_validated():
    with pytest.raises(TypeError, match='loss_scale'):
        _wrapper(loss_scale='static')


def test_apply_is_idempotent():
    assert patching.apply(['amp_cpu']) == []  # applied on import, once
