"""mmengine 0.10: a stock ``ParamSchedulerHook`` steps per micro-step under accumulation.

mmengine's ``ParamSchedulerHook.after_train_iter`` steps every iteration-based scheduler
after every loop iteration, so with gradient accumulation a scheduler's ``begin`` /
``end`` count micro-steps (mmengine issue #1308). Configs prepared by the plugin use
``OptimizerStepParamSchedulerHook`` instead; a runner built without that preparation
(``Runner(...)``) that holds a ``GradientCumulativeOptimizerHook`` still has the stock
hook. The patch skips, in the stock method, the iterations that did not end with an
optimizer step, and only in a runner holding a hook that asks for it
(``gates_param_schedulers`` true: the accumulation hook with a window > 1); in every
other runner the method is upstream's, call for call.
"""
from typing import Any, List

from mmengine.hooks import ParamSchedulerHook
from mmengine.optim import OptimWrapper, OptimWrapperDict

from ..patching import Change, Patch, declare

UPSTREAM = 'mmengine>=0.10,<0.11'
ASK = 'gates_param_schedulers'  # the hook attribute that asks for the gate


def gated(runner: Any) -> bool:
    """Whether ``runner`` holds a hook that asks stock scheduler hooks to step per
    optimizer step."""
    return any(getattr(hook, ASK, False) for hook in getattr(runner, 'hooks', ()))


def _stepped(runner: Any) -> bool:
    """Whether the iteration that just ran ended with an optimizer step
    (``should_update()`` read after ``update_params``; always true without a window)."""
    wrapper = runner.optim_wrapper
    if isinstance(wrapper, OptimWrapperDict) or not isinstance(wrapper, OptimWrapper):
        return True
    return wrapper.should_update()


def _after_train_iter(upstream: Any) -> Any:

    def after_train_iter(self, runner, batch_idx: int, data_batch: Any = None,
                         outputs: Any = None) -> None:
        if gated(runner) and not _stepped(runner):
            return None  # inside an accumulation window: no optimizer step, no schedule
        return upstream(self, runner, batch_idx, data_batch, outputs)

    after_train_iter.__doc__ = upstream.__doc__
    after_train_iter.original = upstream
    return after_train_iter


def _changes() -> List[Change]:
    upstream = ParamSchedulerHook.__dict__['after_train_iter']
    return [Change(ParamSchedulerHook, 'after_train_iter', _after_train_iter(upstream))]


PATCH = declare(Patch(
    name='param_scheduler_gate', kind='fixes',
    targets=('mmengine.hooks.ParamSchedulerHook.after_train_iter',),
    upstream=UPSTREAM, changes=_changes, issue='mmengine #1308',
    why='the stock ParamSchedulerHook steps iteration-based schedulers per micro-step '
        'under accumulation: skipped inside a window, only in runners whose '
        'GradientCumulativeOptimizerHook asks for it'))
