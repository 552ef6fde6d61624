"""OptimizerStepParamSchedulerHook: iteration-based schedulers step per optimizer step."""
from typing import Optional, Union

from mmengine.hooks import ParamSchedulerHook
from mmengine.optim import OptimWrapper, OptimWrapperDict

from mmdet3d.registry import HOOKS

from ..registry import register

DATA_BATCH = Optional[Union[dict, tuple, list]]


def optimizer_stepped(runner) -> bool:
    """Whether the iteration that just ran ended with an optimizer step.

    ``OptimWrapper.should_update()`` evaluated after ``update_params`` is exactly the
    condition under which it stepped (always True without accumulation).
    """
    wrapper = runner.optim_wrapper
    if isinstance(wrapper, OptimWrapperDict) or not isinstance(wrapper, OptimWrapper):
        return True
    return wrapper.should_update()


@register(HOOKS)
class OptimizerStepParamSchedulerHook(ParamSchedulerHook):
    """``ParamSchedulerHook`` whose iteration-based schedulers count optimizer steps.

    mmengine's hook steps every ``by_epoch=False`` scheduler after every loop
    iteration, i.e. per micro-step under gradient accumulation (mmengine issue #1308).
    This one skips iterations that did not end with an optimizer step; epoch-based
    schedulers and validation-driven ones behave as in the parent. Without
    accumulation it is identical to ``ParamSchedulerHook``. The
    :class:`GradientCumulativeOptimizerHook` config step installs it as
    ``default_hooks.param_scheduler``; ``scheduler_unit`` tells config tools (the
    scaling recipe) that scheduler counts are in optimizer steps.

    No arguments. Priority ``LOW`` (as ``ParamSchedulerHook``).
    """

    priority = 'LOW'
    scheduler_unit = 'optimizer_step'

    def after_train_iter(self, runner, batch_idx: int, data_batch: DATA_BATCH = None,
                         outputs: Optional[dict] = None) -> None:
        """Step the iteration-based schedulers if this iteration stepped the optimizer
        (``ParamSchedulerHook.after_train_iter``), else nothing."""
        if optimizer_stepped(runner):
            super().after_train_iter(runner, batch_idx, data_batch, outputs)
