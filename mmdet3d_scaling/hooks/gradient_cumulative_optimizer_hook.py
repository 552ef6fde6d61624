"""GradientCumulativeOptimizerHook: gradient accumulation in optimizer-step units.

mmengine's ``OptimWrapper`` already divides the loss, steps once per window, skips DDP
gradient sync inside a window (``optim_context`` + ``no_sync``) and handles a partial
last window (``initialize_count_status``). This hook keeps all of that and fixes what
it leaves to the user: parameter schedulers advance per optimizer step instead of per
micro-step (mmengine issue #1308), windows are aligned to epochs in epoch-based loops,
BatchNorm is named in a warning, and a checkpoint saved in the middle of a window
carries the accumulated gradients so that a resume continues the window exactly
(:class:`~.accumulation_checkpoint_hook.AccumulationCheckpointHook`, which it extends).

The window has one source at run time: the optim wrapper (``accumulative_counts``). The
hook's ``cumulative_iters`` is a request that ``before_run`` puts into the wrapper; from
then on the hook reads the wrapper (:mod:`mmdet3d_scaling.engine.optim_state`).
"""
import copy
import logging
import math
from typing import Any, List, Optional

import torch
from mmengine.logging import print_log
from mmengine.optim import OptimWrapper, OptimWrapperDict
from mmengine.registry import PARAM_SCHEDULERS
from mmengine.runner import IterBasedTrainLoop
from torch.nn.modules.batchnorm import _BatchNorm

from mmdet3d.registry import HOOKS

from ..patches.fixes import param_scheduler_gate
from ..engine.optim_state import (accumulation, reset_to_initial, set_accumulation,
                                  set_count_status)
from ..registry import register
from ..utils.model import unwrap_model
from .accumulation_checkpoint_hook import CHECKPOINT_KEY  # noqa: F401  (kept importable)
from .accumulation_checkpoint_hook import AccumulationCheckpointHook

_MAX_LISTED_LAYERS = 8


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
        self._requested = cumulative_iters
        self._wrapper: Optional[OptimWrapper] = None  # holds the window once requested
        self.grad_clip = dict(grad_clip) if grad_clip else None
        self._warned_batch_norm = False
        # read by the param_scheduler_gate patch: stock ParamSchedulerHooks of this
        # runner step per optimizer step (set in before_run when the window is > 1)
        setattr(self, param_scheduler_gate.ASK, False)
        super().__init__()

    @property
    def cumulative_iters(self) -> int:
        """Micro-steps per optimizer step: the optim wrapper's window once the request
        is in it (``before_run``), before that the ``cumulative_iters`` asked for."""
        if self._wrapper is None:
            return self._requested
        return accumulation(self._wrapper)

    # ------------------------------------------------------------------ setup
    def before_run(self, runner) -> None:
        """Put the window and the clipping into the optim wrapper; with accumulation,
        warn about BatchNorm and make the parameter schedulers count optimizer steps.

        Nothing for ``runner.val()`` / ``runner.test()`` (no optim wrapper is built).
        """
        wrapper = runner.optim_wrapper
        if not self._trains(wrapper):
            return
        self.request_accumulation(wrapper)
        self._reconcile_clip(wrapper)
        if self.cumulative_iters == 1:
            return
        self._warn_batch_norm(runner)
        self._rebuild_schedulers(runner, wrapper)
        # a stock ParamSchedulerHook (runners built without prepare_config) steps per
        # optimizer step: the declared patch param_scheduler_gate reads this
        setattr(self, param_scheduler_gate.ASK, True)

    @staticmethod
    def _trains(wrapper: Any) -> bool:
        """Whether ``wrapper`` is one built optim wrapper (an error for several)."""
        if isinstance(wrapper, OptimWrapperDict):
            raise TypeError(
                'GradientCumulativeOptimizerHook supports one optimizer '
                '(OptimWrapper / AmpOptimWrapper), got an OptimWrapperDict with '
                f'{list(wrapper.keys())}.')
        return isinstance(wrapper, OptimWrapper)  # else val() / test(): nothing trains

    def request_accumulation(self, optim_wrapper: Any) -> None:
        """Put ``cumulative_iters`` into ``optim_wrapper`` and read the window from it
        from now on (:class:`~mmdet3d_scaling.engine.optim_state.AccumulationRequest`).

        Args:
            optim_wrapper: the runner's built optim wrapper.

        Raises:
            ValueError: when the wrapper already accumulates over another window.
        """
        if optim_wrapper is self._wrapper or not self._trains(optim_wrapper):
            return
        current = accumulation(optim_wrapper)
        if current != self._requested:
            if current != 1:
                raise ValueError(
                    f'GradientCumulativeOptimizerHook(cumulative_iters='
                    f'{self._requested}) conflicts with optim_wrapper '
                    f'accumulative_counts={current}. Set one value: remove '
                    'optim_wrapper.accumulative_counts or make both equal.')
            set_accumulation(optim_wrapper, self._requested)
        self._wrapper = optim_wrapper

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

    # ---------------------------------------------------------------- windows
    def before_train(self, runner) -> None:
        """Restore the gradients of a window a resumed checkpoint holds; else, resuming
        an epoch-based run inside a window, say that no gradient is lost."""
        if self._restore_pending(runner):
            return
        if (runner.iter % self.cumulative_iters and self.cumulative_iters > 1
                and not isinstance(runner.train_loop, IterBasedTrainLoop)):
            print_log(
                f'GradientCumulativeOptimizerHook: windows are aligned to epochs, so '
                f'resuming at iteration {runner.iter} loses no gradient (mmengine\'s '
                'warning above counts windows from iteration 0).', logger='current')

    def before_train_epoch(self, runner) -> None:
        """Epoch-based loops: start the epoch with a fresh window, sized so that the
        epoch's last (partial) window divides its loss by its own length."""
        if self.cumulative_iters == 1 or isinstance(runner.train_loop,
                                                    IterBasedTrainLoop):
            return  # iteration-based: runner.train() counted windows from iter 0
        set_count_status(runner.optim_wrapper, 0, len(runner.train_dataloader))

