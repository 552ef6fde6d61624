"""GradientCumulativeOptimizerHook: gradient accumulation in optimizer-step units.

mmengine's ``OptimWrapper`` already divides the loss, steps once per window, skips DDP
gradient sync inside a window (``optim_context`` + ``no_sync``) and handles a partial
last window (``initialize_count_status``). This hook keeps all of that and fixes what
it leaves to the user: parameter schedulers advance per optimizer step instead of per
micro-step (mmengine issue #1308), windows are aligned to epochs in epoch-based loops,
BatchNorm is named in a warning, and a checkpoint saved in the middle of a window
carries the accumulated gradients so that a resume continues the window exactly.
"""
import copy
import logging
import math
from functools import wraps
from typing import Callable, Dict, List, Optional, Union

import torch
from mmengine.dist import all_reduce, is_distributed
from mmengine.hooks import CheckpointHook, Hook, ParamSchedulerHook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.optim import OptimWrapper, OptimWrapperDict
from mmengine.registry import PARAM_SCHEDULERS
from mmengine.runner import IterBasedTrainLoop
from torch.nn.modules.batchnorm import _BatchNorm

from mmdet3d.registry import HOOKS

from ..engine.optim_state import (accumulation, count_state, micro_steps_in_window,
                                  reset_to_initial, set_accumulation, set_count_status)
from ..registry import register
from .optimizer_step_param_scheduler_hook import optimizer_stepped

DATA_BATCH = Optional[Union[dict, tuple, list]]
CHECKPOINT_KEY = 'gradient_accumulation'
_GATED = '_mmdet3d_scaling_accumulation_gate'
_MAX_LISTED_LAYERS = 8


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DDP/MMDistributedDataParallel wrapper (or ``model``)."""
    return model.module if is_model_wrapper(model) else model


def batch_norm_layers(model: torch.nn.Module) -> List[str]:
    """Names of the BatchNorm (incl. SyncBatchNorm) layers of ``model``."""
    return [name for name, m in unwrap_model(model).named_modules()
            if isinstance(m, _BatchNorm)]


def _clip_spec(clip: Optional[dict]) -> Optional[dict]:
    """A clip_grad dict with its ``type`` made explicit, for comparison."""
    if not clip:
        return None
    spec = dict(clip)
    spec.setdefault('type', 'norm')
    return spec


def _wrapper_clip_spec(wrapper: OptimWrapper) -> Optional[dict]:
    kwargs = getattr(wrapper, 'clip_grad_kwargs', None)
    if not kwargs:
        return None
    kind = 'value' if wrapper.grad_name == 'grad_value' else 'norm'
    return dict(kwargs, type=kind)


def _after_optimizer_step(runner, after_train_iter: Callable) -> Callable:

    @wraps(after_train_iter)
    def gated(*args, **kwargs):
        if optimizer_stepped(runner):
            return after_train_iter(*args, **kwargs)
        return None

    return gated


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
        # Restored in before_train: runner.train() resets the window counters after
        # loading, and a plain `load_from` (fine-tuning) must not get the gradients.
        self._to_restore = checkpoint.get(CHECKPOINT_KEY)

    def before_train(self, runner) -> None:
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
        elif count_state(wrapper)['_inner_count'] % window != micro_steps:
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


@register(HOOKS)
class GradientCumulativeOptimizerHook(AccumulationCheckpointHook):
    """Accumulate gradients over ``cumulative_iters`` micro-steps per optimizer step.

    Use it from ``custom_hooks=[dict(type='GradientCumulativeOptimizerHook',
    cumulative_iters=4)]`` or with mmcv 1.x's ``optimizer_config = dict(
    type='GradientCumulativeOptimizerHook', cumulative_iters=4, grad_clip=...)``
    (translated by :mod:`mmdet3d_scaling.config.legacy_keys`). With ``N =
    cumulative_iters``, a user can rely on:

    - **Loss divided by the window**: each micro-step's loss is divided by ``N`` (by
      ``k`` in a partial window of ``k`` micro-steps), so a window of ``N`` batches of
      ``b`` samples gives the gradient of one batch of ``N * b`` samples for losses
      that average over the batch.
    - **One optimizer step per window**, with gradient clipping
      (``optim_wrapper.clip_grad``) applied to the accumulated gradient at that step.
    - **DDP gradient sync only on the window's last micro-step** (``no_sync`` on the
      others, through ``OptimWrapper.optim_context``).
    - **Windows**: epoch-based loops align windows to epochs; an epoch of ``L``
      micro-steps ends with a window of ``L % N`` micro-steps (when non-zero) whose
      loss is divided by ``L % N``, and the epoch has ``ceil(L / N)`` optimizer steps.
      Iteration-based loops count windows from iteration 0; ``max_iters`` counts
      micro-steps and a partial last window is stepped the same way.
    - **Parameter schedulers count optimizer steps**: iteration-based schedulers
      (``by_epoch=False``) step once per optimizer step; their ``begin``/``end`` are in
      optimizer steps and a missing ``end`` is the run's number of optimizer steps.
      Epoch-based schedulers converted with ``convert_to_iter_based=True`` are
      rebuilt with ``epoch_length = ceil(L / N)`` so that they keep their epoch
      meaning. Epoch-based schedulers are unchanged.
    - **BatchNorm**: a warning, once, naming the BatchNorm layers (they see
      micro-batches, so accumulation is not exactly a larger batch for them).
    - **Resume in the middle of a window**: a checkpoint saved inside a window holds
      the accumulated gradients (averaged over ranks in distributed runs) and the
      position in the window; resuming an iteration-based run restores them and
      finishes the window as if never interrupted (:class:`AccumulationCheckpointHook`,
      which this hook extends). Epoch-based loops restart an interrupted epoch from its
      first batch, so there the partial window is dropped with a warning.

    Args:
        cumulative_iters (int): micro-steps (iterations) per optimizer step. Default 1
            (no accumulation).
        grad_clip (dict, optional): mmcv 1.x gradient clipping, e.g.
            ``dict(max_norm=35, norm_type=2)``; the same as ``optim_wrapper.clip_grad``
            and an error if that is set to something else. Default None.
    """

    priority = 'NORMAL'  # after_train_iter must run before CheckpointHook (VERY_LOW)

    def __init__(self, cumulative_iters: int = 1, grad_clip: Optional[dict] = None):
        if isinstance(cumulative_iters, bool) or not isinstance(cumulative_iters, int) \
                or cumulative_iters < 1:
            raise ValueError(
                f'GradientCumulativeOptimizerHook: cumulative_iters must be an integer '
                f'>= 1, got {cumulative_iters!r}.')
        if grad_clip is not None and not isinstance(grad_clip, dict):
            raise TypeError(
                f'GradientCumulativeOptimizerHook: grad_clip must be a dict such as '
                f'dict(max_norm=35, norm_type=2), got {grad_clip!r}.')
        self.cumulative_iters = cumulative_iters
        self.grad_clip = dict(grad_clip) if grad_clip else None
        self._warned_batch_norm = False
        super().__init__()

    # ------------------------------------------------------------------ setup
    def before_run(self, runner) -> None:
        wrapper = runner.optim_wrapper
        if isinstance(wrapper, OptimWrapperDict):
            raise TypeError(
                'GradientCumulativeOptimizerHook supports one optimizer '
                '(OptimWrapper / AmpOptimWrapper), got an OptimWrapperDict with '
                f'{list(wrapper.keys())}.')
        if not isinstance(wrapper, OptimWrapper):
            return  # runner.val() / runner.test(): nothing is trained
        self._reconcile_counts(wrapper)
        self._reconcile_clip(wrapper)
        if self.cumulative_iters == 1:
            return
        self._warn_batch_norm(runner)
        self._rebuild_schedulers(runner, wrapper)
        self._gate_scheduler_hooks(runner)

    def _reconcile_counts(self, wrapper: OptimWrapper) -> None:
        current = accumulation(wrapper)
        if current == self.cumulative_iters:
            return
        if current != 1:
            raise ValueError(
                f'GradientCumulativeOptimizerHook(cumulative_iters='
                f'{self.cumulative_iters}) conflicts with optim_wrapper '
                f'accumulative_counts={current}. Set one value: remove '
                'optim_wrapper.accumulative_counts or make both equal.')
        set_accumulation(wrapper, self.cumulative_iters)

    def _reconcile_clip(self, wrapper: OptimWrapper) -> None:
        wanted, current = _clip_spec(self.grad_clip), _wrapper_clip_spec(wrapper)
        if wanted is None or wanted == current:
            return
        if current is not None:
            raise ValueError(
                f'GradientCumulativeOptimizerHook(grad_clip={self.grad_clip}) conflicts '
                f'with optim_wrapper.clip_grad={current}. Set gradient clipping once, '
                'in optim_wrapper.clip_grad.')
        # Let OptimWrapper parse the clip settings the way it does for its own config.
        parsed = OptimWrapper(wrapper.optimizer, clip_grad=dict(self.grad_clip))
        wrapper.clip_grad_kwargs = parsed.clip_grad_kwargs
        wrapper.clip_func, wrapper.grad_name = parsed.clip_func, parsed.grad_name

    def _warn_batch_norm(self, runner) -> None:
        names = batch_norm_layers(runner.model)
        if not names or self._warned_batch_norm:
            return
        self._warned_batch_norm = True
        shown = ', '.join(names[:_MAX_LISTED_LAYERS])
        if len(names) > _MAX_LISTED_LAYERS:
            shown += f' and {len(names) - _MAX_LISTED_LAYERS} more'
        batch = getattr(runner.train_dataloader, 'batch_size', None) or '?'
        print_log(
            f'GradientCumulativeOptimizerHook: the model has {len(names)} BatchNorm '
            f'layer(s) ({shown}). They normalise each micro-batch ({batch} samples per '
            f'process), not the accumulated {self.cumulative_iters} x {batch}, so '
            'accumulation is not exactly a larger batch for them. Consider frozen BN '
            '(norm_eval=True), GroupNorm/LayerNorm, or a larger per-GPU batch. Their '
            f'running statistics also update {self.cumulative_iters} times a step; '
            "the scaling recipe (scaling = dict(...), bn_momentum='per_step') converts "
            'their momentum per optimizer step.',
            logger='current', level=logging.WARNING)

    # ------------------------------------------------------ parameter schedulers
    def optimizer_steps_per_epoch(self, runner) -> int:
        """Optimizer steps in one pass over the train dataloader: ceil(L / N)."""
        return math.ceil(len(runner.train_dataloader) / self.cumulative_iters)

    def total_optimizer_steps(self, runner) -> int:
        """Optimizer steps of the whole run."""
        if isinstance(runner.train_loop, IterBasedTrainLoop):
            return math.ceil(runner.max_iters / self.cumulative_iters)
        return runner.max_epochs * self.optimizer_steps_per_epoch(runner)

    def _rebuild_schedulers(self, runner, wrapper: OptimWrapper) -> None:
        """Rebuild the schedulers with iteration counts in optimizer steps.

        Runs in ``before_run``, i.e. before ``load_or_resume`` restores their state.
        """
        built = runner.param_schedulers
        if not built:
            return
        cfgs = runner.cfg.get('param_scheduler') if runner.cfg else None
        cfgs = [cfgs] if isinstance(cfgs, dict) else list(cfgs or [])
        if len(cfgs) != len(built) or not all(isinstance(c, dict) for c in cfgs):
            if any(not s.by_epoch for s in built):
                print_log(
                    'GradientCumulativeOptimizerHook: the parameter schedulers were '
                    'not built from runner.cfg.param_scheduler, so they cannot be '
                    'rebuilt; they step once per optimizer step, but their begin/end '
                    'and converted epoch lengths stay as built (in micro-steps).',
                    logger='current', level=logging.WARNING)
            return
        # The first build already applied each scheduler's initial value (e.g. a
        # warm-up factor); start again from the values the schedulers recorded.
        reset_to_initial(wrapper)
        steps_per_epoch = self.optimizer_steps_per_epoch(runner)
        total = self.total_optimizer_steps(runner)
        schedulers = []
        for cfg in cfgs:
            cfg = copy.deepcopy(cfg)
            cfg.setdefault('end', runner.max_epochs if cfg.get('by_epoch', True)
                           else total)
            schedulers.append(PARAM_SCHEDULERS.build(
                cfg, default_args=dict(optimizer=wrapper, epoch_length=steps_per_epoch)))
        runner.param_schedulers = schedulers
        for cfg, scheduler in zip(cfgs, schedulers):
            if not scheduler.by_epoch and total < scheduler.end < 2**31:  # not INF
                print_log(
                    f'GradientCumulativeOptimizerHook: {cfg.get("type")} ends at '
                    f'optimizer step {scheduler.end}, but this run has {total} '
                    f'optimizer steps ({self.cumulative_iters} micro-steps each): '
                    'iteration-based scheduler counts are optimizer steps.',
                    logger='current', level=logging.WARNING)
        print_log(
            f'GradientCumulativeOptimizerHook: {self.cumulative_iters} micro-steps per '
            f'optimizer step; parameter schedulers count optimizer steps '
            f'({steps_per_epoch} per epoch, {total} in this run).', logger='current')

    @staticmethod
    def _gate_scheduler_hooks(runner) -> None:
        """Make a stock ParamSchedulerHook step iteration-based schedulers per step.

        Configs prepared by the plugin already use OptimizerStepParamSchedulerHook;
        this covers runners built without ``prepare_config`` (``Runner(...)``).
        """
        for hook in runner.hooks:
            if (isinstance(hook, ParamSchedulerHook)
                    and getattr(hook, 'scheduler_unit', None) != 'optimizer_step'
                    and not getattr(hook, _GATED, False)):
                hook.after_train_iter = _after_optimizer_step(
                    runner, hook.after_train_iter)
                setattr(hook, _GATED, True)

    # ---------------------------------------------------------------- windows
    def before_train(self, runner) -> None:
        if self._restore_pending(runner):
            return
        if (runner.iter % self.cumulative_iters and self.cumulative_iters > 1
                and not isinstance(runner.train_loop, IterBasedTrainLoop)):
            print_log(
                f'GradientCumulativeOptimizerHook: windows are aligned to epochs, so '
                f'resuming at iteration {runner.iter} loses no gradient (mmengine\'s '
                'warning above counts windows from iteration 0).', logger='current')

    def before_train_epoch(self, runner) -> None:
        if self.cumulative_iters == 1 or isinstance(runner.train_loop,
                                                    IterBasedTrainLoop):
            return  # iteration-based: runner.train() counted windows from iter 0
        set_count_status(runner.optim_wrapper, 0, len(runner.train_dataloader))

