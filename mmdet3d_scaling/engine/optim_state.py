"""The one place that reads and writes mmengine's private optim-wrapper counters.

mmengine 0.10's ``OptimWrapper`` keeps its accumulation state in private attributes
(``_accumulative_counts``, ``_inner_count``, ``_max_counts``, ``_remainder_counts``) and
offers no setter for a count chosen after the wrapper was built. The plugin changes them
in three situations (the accumulation hook, the auto batch size search, a new scaling
plan at run time); all of them go through these functions, so a change of mmengine's
internals is fixed here once.

The wrapper is also the one source of the accumulation window at run time: the hooks,
the runner and the benchmarks read it with :func:`accumulation`. A hook that asks for a
window (``GradientCumulativeOptimizerHook(cumulative_iters=N)``) implements
:class:`AccumulationRequest`: it puts its request into the wrapper once and reads the
wrapper from then on, so a plan changed at run time needs no second copy updated.
"""
from typing import Any, Dict, List, Protocol, runtime_checkable

from mmengine.optim import OptimWrapper, OptimWrapperDict

COUNT_ATTRS = ('_inner_count', '_accumulative_counts', '_max_counts', '_remainder_counts')


def optim_wrappers(optim_wrapper: Any) -> List[OptimWrapper]:
    """The plain optim wrappers inside ``optim_wrapper`` (one unless it is a dict)."""
    if isinstance(optim_wrapper, OptimWrapperDict):
        return list(optim_wrapper.optim_wrappers.values())
    return [optim_wrapper]


def accumulation(optim_wrapper: Any) -> int:
    """Micro-batches per optimizer step (a wrapper not built yet: its config's value)."""
    if isinstance(optim_wrapper, OptimWrapperDict):
        optim_wrapper = next(iter(optim_wrapper.values()))
    if isinstance(optim_wrapper, dict):
        return int(optim_wrapper.get('accumulative_counts', 1))
    return int(getattr(optim_wrapper, '_accumulative_counts', 1))


def micro_steps_done(wrapper: OptimWrapper) -> int:
    """Micro-steps (``update_params`` calls) the wrapper counted in this run."""
    return wrapper._inner_count


@runtime_checkable
class AccumulationRequest(Protocol):
    """A hook that asks for an accumulation window.

    ``request_accumulation(optim_wrapper)`` puts the request into the wrapper (an
    error when the wrapper already holds another window) and makes the hook read the
    window from the wrapper from then on. :meth:`ScalingRunner.apply_plan
    <mmdet3d_scaling.engine.runner.ScalingRunner.apply_plan>` calls it before it sets a
    new window, so the request is checked against the configured wrapper, not the new
    plan; the hook's own ``before_run`` calls it otherwise.
    """

    def request_accumulation(self, optim_wrapper: Any) -> None:
        ...


def set_accumulation(optim_wrapper: Any, count: int) -> None:
    """Accumulate ``count`` micro-batches per optimizer step from now on."""
    for wrapper in optim_wrappers(optim_wrapper):
        wrapper._accumulative_counts = count


def count_state(wrapper: OptimWrapper) -> Dict[str, int]:
    """A copy of the wrapper's counters (see :func:`restore_count_state`)."""
    return {name: getattr(wrapper, name) for name in COUNT_ATTRS}


def restore_count_state(wrapper: OptimWrapper, state: Dict[str, int]) -> None:
    """Put back the counters :func:`count_state` copied."""
    for name, value in state.items():
        setattr(wrapper, name, value)


def step_every_call(optim_wrapper: Any) -> None:
    """Every ``update_params`` steps the optimizer (no accumulation, no run length)."""
    for wrapper in optim_wrappers(optim_wrapper):
        wrapper._accumulative_counts = 1
        wrapper._inner_count = 0
        wrapper._max_counts = -1


def set_count_status(wrapper: OptimWrapper, done: int, total: int) -> None:
    """Put ``wrapper`` ``done`` micro-steps into a run of ``total`` micro-steps.

    The same state as ``OptimWrapper.initialize_count_status`` without its log lines,
    which would otherwise repeat at every epoch.
    """
    wrapper._inner_count = done
    wrapper._max_counts = total
    wrapper._remainder_counts = total % wrapper._accumulative_counts


def micro_steps_in_window(wrapper: OptimWrapper) -> int:
    """Micro-steps accumulated since the last optimizer step (0: gradients are clear)."""
    if wrapper.should_update():  # the last backward closed a window (or none ran yet)
        return 0
    return wrapper._inner_count % wrapper._accumulative_counts


def reset_to_initial(optim_wrapper: Any) -> None:
    """Undo the schedulers' first step: every ``initial_x`` back into ``x`` (and Adam's
    ``betas[0]`` from ``initial_momentum``), before schedulers are built again."""
    for wrapper in optim_wrappers(optim_wrapper):
        for group in wrapper.optimizer.param_groups:
            for key in [k for k in group if k.startswith('initial_')]:
                group[key[len('initial_'):]] = group[key]
            if 'initial_momentum' in group and 'betas' in group:
                group['betas'] = (group['initial_momentum'], *group['betas'][1:])


def scale_lr(optim_wrapper: Any, factor: float) -> None:
    """Multiply every group's ``lr`` (and ``initial_lr``, the schedulers' base) by ``factor``."""
    for wrapper in optim_wrappers(optim_wrapper):
        for group in wrapper.optimizer.param_groups:
            group['lr'] *= factor
            if 'initial_lr' in group:
                group['initial_lr'] *= factor
