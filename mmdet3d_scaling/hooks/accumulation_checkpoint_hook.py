"""AccumulationCheckpointHook: a checkpoint inside an accumulation window keeps its
gradients.

mmengine's ``OptimWrapper`` accumulates ``accumulative_counts`` micro-steps per optimizer
step, but a checkpoint holds no gradients: one saved inside a window loses the
micro-steps already accumulated. This hook saves them (averaged over ranks) with the
position in the window and restores them on resume.
"""
import logging
from typing import Dict, Optional, Union

import torch
from mmengine.dist import all_reduce, is_distributed
from mmengine.hooks import CheckpointHook, Hook
from mmengine.logging import print_log
from mmengine.optim import OptimWrapper
from mmengine.runner import IterBasedTrainLoop

from mmdet3d.registry import HOOKS

from ..engine.optim_state import accumulation, micro_steps_done, micro_steps_in_window
from ..registry import register
from ..utils.model import unwrap_model

DATA_BATCH = Optional[Union[dict, tuple, list]]
#: the checkpoint key that holds an unfinished window's gradients
CHECKPOINT_KEY = 'gradient_accumulation'


@register(HOOKS)
class AccumulationCheckpointHook(Hook):
    """A checkpoint saved inside an accumulation window carries the window's gradients.

    mmengine's ``OptimWrapper`` accumulates ``accumulative_counts`` micro-steps per
    optimizer step but a checkpoint holds no gradients, so a checkpoint taken inside a
    window loses the micro-steps already accumulated. With this hook such a checkpoint
    also holds the accumulated gradients (averaged over ranks in distributed runs) and
    the position in the window; resuming an iteration-based run with the same
    accumulation restores them and finishes the window as if never interrupted.
    Anything else (another accumulation, an epoch-based loop, which restarts an
    interrupted epoch) drops them with a warning that says why.

    The ``scaling`` config recipe adds it; :class:`GradientCumulativeOptimizerHook`
    includes it. The window length is read from the optim wrapper at run time, so a
    plan changed at run time (auto batch size) is followed.

    No arguments. Priority ``NORMAL``: its ``after_train_iter`` must run before
    ``CheckpointHook`` (``VERY_LOW``).
    """

    priority = 'NORMAL'

    def __init__(self) -> None:
        self._to_restore: Optional[dict] = None
        self._rank_mean_grads: Optional[dict] = None
        self._rank_mean_iter = -1

    @staticmethod
    def _window(runner) -> int:
        """Micro-steps per optimizer step (1: no accumulation or not a plain wrapper)."""
        wrapper = runner.optim_wrapper
        return accumulation(wrapper) if isinstance(wrapper, OptimWrapper) else 1

    def after_train_iter(self, runner, batch_idx: int, data_batch: DATA_BATCH = None,
                         outputs: Optional[dict] = None) -> None:
        """Distributed runs: average the partial window's gradients over the ranks when
        a CheckpointHook saves after this iteration (every rank must take part)."""
        # Only rank 0 writes checkpoints; average the partial gradients of all ranks
        # now, while every rank runs this hook, if a checkpoint follows this iteration.
        if (self._window(runner) > 1 and is_distributed()
                and micro_steps_in_window(runner.optim_wrapper)
                and self._checkpoint_due(runner)):
            self._rank_mean_grads = self._collect_grads(runner, across_ranks=True)
            self._rank_mean_iter = runner.iter

    @staticmethod
    def _checkpoint_due(runner) -> bool:
        """Whether a CheckpointHook saves by iteration after this iteration."""
        for hook in runner.hooks:
            if isinstance(hook, CheckpointHook) and not hook.by_epoch and (
                    hook.every_n_train_iters(runner, hook.interval, hook.save_begin)
                    or (hook.save_last and hook.is_last_train_iter(runner))):
                return True
        return False

    @staticmethod
    def _collect_grads(runner, across_ranks: bool) -> Dict[str, torch.Tensor]:
        params = list(unwrap_model(runner.model).named_parameters())
        if not across_ranks:
            return {n: p.grad.detach().clone() for n, p in params if p.grad is not None}
        # A parameter without a gradient on one rank may have one on another; keep the
        # ones with a gradient somewhere (a zero gradient is not "no gradient").
        has_grad = torch.tensor([p.grad is not None for _, p in params],
                                dtype=torch.float32, device=params[0][1].device)
        all_reduce(has_grad, op='sum')
        grads = {}
        for (name, param), anywhere in zip(params, has_grad.tolist()):
            if not anywhere:
                continue
            grad = param.grad.detach().clone() if param.grad is not None \
                else torch.zeros_like(param)
            all_reduce(grad, op='mean')
            grads[name] = grad
        return grads

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        """Add the unfinished window's gradients and position to ``checkpoint``
        (under ``CHECKPOINT_KEY``); nothing when no window is open."""
        window = self._window(runner)
        if window == 1:
            return
        micro_steps = micro_steps_in_window(runner.optim_wrapper)
        if not micro_steps:
            return
        if not is_distributed():
            grads = self._collect_grads(runner, across_ranks=False)
        elif self._rank_mean_iter == runner.iter:
            grads = self._rank_mean_grads
        else:
            print_log(
                f'{type(self).__name__}: checkpoint at iteration {runner.iter + 1} is '
                f'inside an accumulation window ({micro_steps}/{window} micro-steps) '
                'and was not announced by a CheckpointHook interval, so the other '
                'ranks\' gradients are not in it; resuming from it restarts the window.',
                logger='current', level=logging.WARNING)
            return
        checkpoint[CHECKPOINT_KEY] = dict(
            cumulative_iters=window, micro_steps=micro_steps,
            iter=checkpoint.get('meta', {}).get('iter', runner.iter + 1), grads=grads)

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        """Keep the window a loaded checkpoint holds, for :meth:`before_train`."""
        # Restored in before_train: runner.train() resets the window counters after
        # loading, and a plain `load_from` (fine-tuning) must not get the gradients.
        self._to_restore = checkpoint.get(CHECKPOINT_KEY)

    def before_train(self, runner) -> None:
        """Restore the gradients of a resumed checkpoint's unfinished window (or drop
        them with a warning that says why)."""
        self._restore_pending(runner)

    def _restore_pending(self, runner) -> bool:
        """Restore the gradients a resumed checkpoint holds; whether there were any."""
        pending, self._to_restore = self._to_restore, None
        if not pending:
            return False
        self._restore(runner, pending)
        return True

    def _restore(self, runner, state: dict) -> None:
        micro_steps, saved_n = state['micro_steps'], state['cumulative_iters']
        if state.get('iter') != runner.iter:
            return  # loaded as weights (load_from) or converted to another plan
        wrapper = runner.optim_wrapper
        window = self._window(runner)
        reason = None
        if not isinstance(runner.train_loop, IterBasedTrainLoop):
            reason = ('epoch-based loops restart an interrupted epoch from its first '
                      'batch')
        elif saved_n != window:
            reason = (f'the checkpoint accumulated over {saved_n} micro-steps, this run '
                      f'over {window}')
        elif micro_steps_done(wrapper) % window != micro_steps:
            reason = (f'iteration {runner.iter} is not {micro_steps} micro-steps into '
                      'a window')
        if reason:
            print_log(
                f'{type(self).__name__}: the checkpoint holds {micro_steps} accumulated '
                f'micro-steps that are dropped: {reason}.',
                logger='current', level=logging.WARNING)
            return
        params = dict(unwrap_model(runner.model).named_parameters())
        for name, grad in state['grads'].items():
            param = params[name]
            param.grad = grad.to(device=param.device, dtype=param.dtype).clone()
        print_log(
            f'{type(self).__name__}: restored the gradients of {micro_steps} '
            f'micro-step(s) of an unfinished window from the checkpoint; the window '
            f'closes after {window - micro_steps} more (mmengine\'s warning about lost '
            'gradients does not apply).', logger='current')
