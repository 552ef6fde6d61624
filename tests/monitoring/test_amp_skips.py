"""AmpSkips with torch's real GradScaler (its CPU flavour runs the same skip logic)."""
import torch
from mmengine.optim import OptimWrapper, OptimWrapperDict

from mmdet3d_scaling.monitoring.amp_skips import AmpSkips, loss_scaler_of


MODEL = torch.nn.Linear(2, 1)


def _wrapper(**scaler) -> OptimWrapper:
    """An optim wrapper with a GradScaler as an AmpOptimWrapper holds it (``scaler``:
    its arguments; none: no scaler)."""
    wrapper = OptimWrapper(torch.optim.SGD(MODEL.parameters(), lr=0.1))
    if scaler:
        wrapper.loss_scaler = torch.amp.GradScaler('cpu', **scaler)
    return wrapper


def _step(wrapper: OptimWrapper, value: float) -> None:
    """One optimizer step through the scaler; ``value=inf`` gives inf gradients."""
    scaler = wrapper.loss_scaler
    wrapper.optimizer.zero_grad()
    scaler.scale(MODEL(torch.full((1, 2), value)).sum()).backward()
    scaler.step(wrapper.optimizer)
    scaler.update()


def test_skipped_steps_and_scale_per_report():
    wrapper = _wrapper(init_scale=4.0, growth_interval=1000)
    skips = AmpSkips(wrapper)
    for value in (1.0, float('inf'), 1.0):
        _step(wrapper, value)
        skips.after_iter(True)
    figures, asked = skips.figures()
    assert asked == 3 and skips.taken == 2
    assert figures == dict(skipped_steps=1.0, skipped_steps_interval=1.0, grad_scale=2.0)
    _step(wrapper, 1.0)
    skips.after_iter(True)
    skips.after_iter(False)  # an iteration inside an accumulation window asks for none
    figures, asked = skips.figures()
    assert asked == 1
    assert figures['skipped_steps'] == 1.0 and figures['skipped_steps_interval'] == 0.0
    skips.close()
    _step(wrapper, 1.0)  # no longer counted
    assert skips.taken == 3


def test_wrappers_without_a_running_scaler_say_why():
    assert loss_scaler_of(_wrapper())[1] == 'no AmpOptimWrapper (no loss scaling)'
    assert 'loss scaling is off' in loss_scaler_of(_wrapper(enabled=False))[1]
    both = OptimWrapperDict(a=_wrapper(init_scale=2.0), b=_wrapper())
    assert loss_scaler_of(both)[0] is None
    assert 'OptimWrapperDict' in loss_scaler_of(both)[1]
    scaler, why = loss_scaler_of(_wrapper(init_scale=2.0))
    assert isinstance(scaler, torch.amp.GradScaler) and why == ''
