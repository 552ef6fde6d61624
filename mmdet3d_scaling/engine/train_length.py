"""The one place that changes the length of a built train loop.

mmengine 0.10's train loops keep their length in a private attribute (``_max_iters``,
from ``max_iters`` or ``max_epochs x len(dataloader)``) and offer no setter. The plugin
changes it when a new scaling plan is applied at run time (:meth:`ScalingRunner.apply_plan
<mmdet3d_scaling.engine.runner.ScalingRunner.apply_plan>`) and when the scaling benchmark
trains a fixed number of optimizer steps (its timer hook); both go through this module.

It imports only mmengine (the benchmark's stock runs load it without the plugin).
"""
from typing import Any

from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop


def set_max_iters(loop: Any, max_iters: int) -> None:
    """Make ``loop`` (Epoch- or IterBasedTrainLoop) end after ``max_iters`` iterations.

    Args:
        loop: a built train loop.
        max_iters: loop iterations (micro-batches) of the whole run.

    Raises:
        TypeError: for another kind of loop, whose length this code does not know.
    """
    if not isinstance(loop, (EpochBasedTrainLoop, IterBasedTrainLoop)):
        raise TypeError(f'changing the run length needs EpochBasedTrainLoop or '
                        f'IterBasedTrainLoop, not {type(loop).__name__}.')
    loop._max_iters = int(max_iters)


def train_for(runner: Any, max_iters: int) -> None:
    """Train ``runner`` (built, in ``before_train``) for ``max_iters`` iterations in all.

    Sets the loop's length and sizes the optim wrapper's last accumulation window for
    it again (``OptimWrapper.initialize_count_status``, which ``Runner.train`` called
    with the configured length).

    Args:
        runner: an mmengine Runner whose train loop is built.
        max_iters: loop iterations (micro-batches) of the whole run.
    """
    set_max_iters(runner.train_loop, max_iters)
    runner.optim_wrapper.initialize_count_status(runner.model, runner.iter, max_iters)
