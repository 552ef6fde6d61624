"""engine/optim_state.py: the optim wrapper as the one source of the accumulation window."""
import pytest
import torch
from mmengine.optim import OptimWrapper

from mmdet3d_scaling.engine.optim_state import (AccumulationRequest, accumulation,
                                                micro_steps_done, set_accumulation)
from mmdet3d_scaling.hooks import (AccumulationCheckpointHook,
                                   GradientCumulativeOptimizerHook)


def _wrapper(counts: int = 1) -> OptimWrapper:
    model = torch.nn.Linear(2, 1)
    return OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1),
                        accumulative_counts=counts)


def test_accumulation_of_built_and_unbuilt_wrappers():
    assert accumulation(_wrapper(3)) == 3
    assert accumulation(dict(accumulative_counts=5)) == 5  # a config, not built yet
    assert accumulation(dict()) == 1


def test_the_hook_reads_the_window_from_the_wrapper_once_requested():
    hook = GradientCumulativeOptimizerHook(cumulative_iters=4)
    assert isinstance(hook, AccumulationRequest)
    assert not isinstance(AccumulationCheckpointHook(), AccumulationRequest)
    assert hook.cumulative_iters == 4  # the request, before a wrapper holds it
    wrapper = _wrapper()
    hook.request_accumulation(wrapper)
    assert accumulation(wrapper) == 4
    set_accumulation(wrapper, 2)  # a plan changed at run time: nothing else to update
    assert hook.cumulative_iters == 2
    hook.request_accumulation(wrapper)  # the same wrapper again: the plan stays
    assert accumulation(wrapper) == 2


def test_a_request_against_another_configured_window_is_an_error():
    hook = GradientCumulativeOptimizerHook(cumulative_iters=4)
    with pytest.raises(ValueError, match=r'cumulative_iters=4\) conflicts with '
                                         r'optim_wrapper accumulative_counts=2'):
        hook.request_accumulation(_wrapper(2))
    same = _wrapper(4)
    hook.request_accumulation(same)
    assert accumulation(same) == 4


def test_micro_steps_done_counts_update_params_calls():
    model = torch.nn.Linear(2, 1)
    wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1),
                           accumulative_counts=2)
    wrapper.initialize_count_status(model, 0, 4)
    for _ in range(3):
        wrapper.update_params(model(torch.ones(1, 2)).sum())
    assert micro_steps_done(wrapper) == 3
