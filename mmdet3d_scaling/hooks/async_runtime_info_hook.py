"""AsyncRuntimeInfoHook: mmengine's RuntimeInfoHook without a wait for the GPU each step.

mmengine's ``RuntimeInfoHook`` puts every loss the model returns into the message hub
with ``.item()``: on CUDA the first read waits until the GPU has finished the step, so
the host cannot queue the next step while the GPU runs the tail of this one (and norm
clipping's ``float(grad_norm)`` waits the same way; the ``deferred_grad_norm`` patch
hands it here instead).
"""
from numbers import Number
from typing import Any, List, Optional, Tuple

import numpy as np
import torch

from mmengine.hooks import CheckpointHook, LoggerHook, RuntimeInfoHook
from mmengine.runner import EpochBasedTrainLoop

from mmdet3d.registry import HOOKS

from ..monitoring.deferred_scalars import DRAINED_INFO, SINK_INFO, DeferredScalars
from ..registry import register

DATA_BATCH = Optional[Any]


@register(HOOKS)
class AsyncRuntimeInfoHook(RuntimeInfoHook):
    """``RuntimeInfoHook`` whose loss and gradient-norm reads do not wait for the GPU.

    Each iteration's CUDA values (the model's ``log_vars`` and, with the
    ``deferred_grad_norm`` patch, norm clipping's ``grad_norm``) are copied to the host
    without blocking and put into the message hub in iteration order at the end of the
    next iteration (the copy has finished by then): one iteration late, no wait, and
    the same iteration on every rank. Where something reads them they are put in first,
    waiting if need be, so what is logged and checked is exact:

    - iterations at which a ``LoggerHook`` logs, validation follows, an iteration-based
      ``CheckpointHook`` saves, an epoch ends, and the last one;
    - before any checkpoint is saved (``before_save_checkpoint``: preemption, best
      checkpoints too), so ``NonFiniteGuardHook`` sees every value before a save.

    Each hand-over is also left in the message hub info ``deferred_scalars_drained``
    (serial number, ``[(iteration, {key: value})]``) for ``NonFiniteGuardHook``, which
    then names the iteration a bad value came from. CPU values arrive at once (a read
    costs no wait there). Learning rates and the rest of ``RuntimeInfoHook`` are upstream's.

    Selected by the config key ``async_logging=True`` (it replaces
    ``default_hooks.runtime_info``); no arguments.
    """

    priority = 'VERY_HIGH'  # RuntimeInfoHook's: before every reader of the message hub

    def __init__(self) -> None:
        self.sink = DeferredScalars()
        self._serial = 0
        self._read_at: List[Tuple[str, int]] = []  # ('iter' | 'inner', interval)

    def before_train(self, runner) -> None:
        """Start the sink and note when readers of the values act."""
        super().before_train(runner)
        self.sink = DeferredScalars()
        runner.message_hub.update_info(SINK_INFO, self.sink, resumed=False)  # not saved
        self._publish(runner, [])
        self._read_at = []
        for hook in runner.hooks:
            if isinstance(hook, LoggerHook):
                self._read_at += [('iter', hook.interval), ('inner', hook.interval)]
            elif isinstance(hook, CheckpointHook) and not hook.by_epoch and hook.interval > 0:
                self._read_at.append(('iter', hook.interval))

    def after_train(self, runner) -> None:
        """Hand over what is left and take the sink out of the message hub."""
        self._hand_over(runner, self.sink.drain())
        runner.message_hub.pop_info(SINK_INFO, None)
        super().after_train(runner)

    def after_train_iter(self, runner, batch_idx: int, data_batch: DATA_BATCH = None,
                         outputs: Optional[dict] = None) -> None:
        """Queue this iteration's values; hand over the finished ones (all where read)."""
        for key, value in (outputs or {}).items():
            if _is_scalar(value):  # through the sink, so each hand-over is complete
                self.sink.add(f'train/{key}', value)
            else:  # upstream's error for a value that is no scalar
                runner.message_hub.update_scalar(f'train/{key}', value)
        self.sink.seal(runner.iter)
        # where read: everything; else up to the previous iteration (done: no wait)
        before = None if self._read_now(runner, batch_idx) else runner.iter
        self._hand_over(runner, self.sink.drain(before=before))

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        """Every value on the host before a save (the guard checks them first)."""
        if len(self.sink):
            self._hand_over(runner, self.sink.drain())

    def _read_now(self, runner, batch_idx: int) -> bool:
        done = runner.iter + 1
        for counter, interval in self._read_at:
            count = done if counter == 'iter' else batch_idx + 1
            if interval > 0 and count % interval == 0:
                return True
        loop = runner.train_loop
        dataloader = getattr(loop, 'dataloader', None)
        if done >= runner.max_iters or (
                dataloader is not None and self.end_of_epoch(dataloader, batch_idx)):
            return True
        return _validates_after(loop, done)

    def _hand_over(self, runner, drained) -> None:
        for _, values in drained:
            for key, value in values.items():
                runner.message_hub.update_scalar(key, value)
        if drained:
            self._publish(runner, drained)

    def _publish(self, runner, drained) -> None:
        self._serial += 1
        runner.message_hub.update_info(DRAINED_INFO, (self._serial, list(drained)),
                                       resumed=False)


def _is_scalar(value: Any) -> bool:
    """A number, or a one-element tensor / array (what upstream logs as a scalar)."""
    if torch.is_tensor(value) or isinstance(value, np.ndarray):
        return value.size == 1 if isinstance(value, np.ndarray) else value.numel() == 1
    return isinstance(value, (Number, np.number))


def _validates_after(loop: Any, done: int) -> bool:
    """Whether an iteration-based loop validates after ``done`` iterations."""
    interval = getattr(loop, 'val_interval', None)
    if isinstance(loop, EpochBasedTrainLoop) or not isinstance(interval, int) \
            or interval <= 0:
        return False  # an epoch-based loop validates at an epoch's end: read there
    return done >= getattr(loop, 'val_begin', 1) and done % interval == 0
