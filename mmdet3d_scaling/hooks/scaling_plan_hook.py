"""ScalingPlanHook: print the scaling plan, store it in checkpoints, and resume a
checkpoint saved with another plan (GPU count, total batch) at the same place in the
schedule, with the LR and scheduler state of an uninterrupted run with the new plan."""
import copy
import warnings
from typing import Any, Dict, Iterator, List, Optional, Tuple

from mmengine.hooks import Hook, ParamSchedulerHook
from mmengine.optim import OptimWrapper, OptimWrapperDict
from mmengine.runner import EpochBasedTrainLoop

from mmdet3d.registry import HOOKS

from ..config.scaling_plan import ScalingPlan, format_plan
from ..engine.optim_state import accumulation
from ..registry import register
from ..patches import patching
from ..patches.fixes import param_scheduler_gate
from .gradient_cumulative_optimizer_hook import GradientCumulativeOptimizerHook

META_KEY = 'scaling_plan'


def runtime_plan(runner) -> ScalingPlan:
    """The plan the runner really uses: loader batch, world size, wrapper accumulation.

    Base batch and LR scaling come from the runner's scaling plan when it has one
    (``ScalingRunner.scaling_plan``, the recipe's plan in force).
    """
    per_gpu = runner.train_dataloader.batch_size
    world = runner.world_size
    acc = accumulation(runner.optim_wrapper)
    total = per_gpu * world * acc
    recorded = getattr(runner, 'scaling_plan', None)
    if recorded is not None:
        base, rule, scale = recorded.base_batch, recorded.lr_scaling, recorded.lr_scale
    else:
        base, rule, scale = total, 'none', 1.0
    return ScalingPlan(world_size=world, per_gpu_batch=per_gpu, accumulation=acc,
                       total_batch=total, base_batch=base, lr_scaling=rule,
                       lr_scale=scale)


def convert_step(count: int, old: ScalingPlan, new: ScalingPlan) -> int:
    """A loop-iteration count under ``old`` -> the count with the same samples under
    ``new``, rounded down to a whole optimizer step."""
    steps = count // old.accumulation
    if old.total_batch == new.total_batch:
        return steps * new.accumulation
    samples = steps * old.total_batch
    return (samples // new.total_batch) * new.accumulation


def same_plan(old: ScalingPlan, new: ScalingPlan) -> bool:
    """Whether a checkpoint of ``old`` resumes under ``new`` without any conversion."""
    return (old.world_size, old.per_gpu_batch, old.accumulation, old.lr_scale) == (
        new.world_size, new.per_gpu_batch, new.accumulation, new.lr_scale)


def scheduler_step_unit(runner) -> str:
    """'optimizer_step' when the runner's ParamSchedulerHook skips the micro-steps of
    an accumulation window (ours, or the stock one gated by the accumulation hook
    through the ``param_scheduler_gate`` patch), else 'iteration' (stock mmengine)."""
    stock_gated = ('param_scheduler_gate' in patching.applied()
                   and param_scheduler_gate.gated(runner))
    for hook in runner.hooks:
        if isinstance(hook, ParamSchedulerHook):
            if getattr(hook, 'scheduler_unit', None) == 'optimizer_step' or stock_gated:
                return 'optimizer_step'
    return 'iteration'


def _scheduler_lists(schedulers: Any) -> Iterator[Tuple[Optional[str], list]]:
    if isinstance(schedulers, dict):
        yield from schedulers.items()
    elif schedulers:
        yield None, schedulers


def _wrappers_with_state(runner, checkpoint: dict) -> List[Tuple[OptimWrapper, dict]]:
    """(live optim wrapper, its saved state in the checkpoint) pairs."""
    saved, wrapper = checkpoint.get('optimizer'), runner.optim_wrapper
    if not saved:
        return []
    if isinstance(wrapper, OptimWrapperDict):
        return [(w, saved[name]) for name, w in wrapper.items() if name in saved]
    return [(wrapper, saved)] if isinstance(wrapper, OptimWrapper) else []


class ScheduleReplay:
    """Step freshly built schedulers as an uninterrupted run would have, to iteration n.

    The schedulers and the optimizer's param groups are the live ones of a runner that
    has not trained yet (built for the current plan, at step 0). Stepping follows
    mmengine's ``ParamSchedulerHook``: iteration-based schedulers after every loop
    iteration (or only after those that end an accumulation window, see
    :func:`scheduler_step_unit`), epoch-based ones after every epoch of an epoch-based
    loop. Chained schedulers (LinearLR, CosineAnnealingLR, ...) compute each value from
    the previous one, so only a replay gives the exact values of the new plan.

    Args:
        runner: the runner, before ``load_or_resume`` loaded optimizer and schedulers.
        accumulation: micro-steps per optimizer step of the current plan.
    """

    def __init__(self, runner, accumulation: int) -> None:
        self.runner = runner
        self.accumulation = accumulation
        self.per_optimizer_step = (accumulation > 1
                                   and scheduler_step_unit(runner) == 'optimizer_step')
        loop = runner.train_loop
        self.epoch_length = (len(runner.train_dataloader)
                             if isinstance(loop, EpochBasedTrainLoop) else None)
        # epoch-aligned windows: the accumulation hook restarts them every epoch
        self.epoch_windows = self.epoch_length is not None and any(
            isinstance(h, GradientCumulativeOptimizerHook) for h in runner.hooks)
        self.max_iters = loop.max_iters

    def window_closes(self, i: int) -> bool:
        """Whether loop iteration ``i`` (0-based) ends with an optimizer step."""
        if not self.per_optimizer_step:
            return True
        if self.epoch_windows:
            j = i % self.epoch_length
            return (j + 1) % self.accumulation == 0 or j + 1 == self.epoch_length
        return (i + 1) % self.accumulation == 0 or i + 1 == self.max_iters

    def run(self, n_iters: int) -> List[str]:
        """Replay ``n_iters`` loop iterations; the names of schedulers left as saved."""
        lists = [s for _, s in _scheduler_lists(self.runner.param_schedulers)]
        kept = [type(s).__name__ for lst in lists for s in lst
                if getattr(s, 'need_val_args', False)]
        with warnings.catch_warnings():  # "scheduler.step() before optimizer.step()"
            warnings.simplefilter('ignore', UserWarning)
            for i in range(n_iters):
                epoch_end = (self.epoch_length is not None
                             and (i + 1) % self.epoch_length == 0)
                closes = self.window_closes(i)
                for lst in lists:
                    for sched in lst:
                        if getattr(sched, 'need_val_args', False):
                            continue  # driven by validation metrics: cannot replay
                        if (not sched.by_epoch and closes) or (sched.by_epoch
                                                               and epoch_end):
                            sched.step()
        return kept


@register(HOOKS)
class ScalingPlanHook(Hook):
    """Print the scaling plan at start, save it in checkpoints, convert on resume.

    Added by the ``scaling`` config recipe (``custom_hooks``); usable on its own.

    On resume, when the checkpoint's plan (world size, per-GPU batch, accumulation, LR
    scale) differs from the current one, the resumed state is that of an uninterrupted
    run with the current plan at the same number of samples seen:

    - ``runner.iter``: samples seen / samples per loop iteration, rounded down to a
      whole optimizer step (epoch-based loops: the saved epoch's first iteration);
    - every parameter scheduler's state and every param group's scheduled values
      (``lr``, ``initial_lr``, momentum, ...): the current run's schedulers, built for
      this plan, are stepped to that iteration as training would have stepped them
      (:class:`ScheduleReplay`), and the checkpoint's values are replaced by theirs.
      So a new total batch gives the new LR scale (``initial_lr`` = configured LR x
      this plan's factor) and a warm-up or cosine schedule continues at the same point.
      Optimizer buffers (momentum, Adam moments) are kept from the checkpoint.
      Validation-driven schedulers (ReduceOnPlateau) keep their saved state, with a
      warning.

    A checkpoint taken inside an accumulation window resumes at the window's start
    under another plan (the window's saved gradients belong to the old split); with the
    same plan :class:`AccumulationCheckpointHook` restores them.

    Priority ``VERY_HIGH``: it converts a loaded checkpoint before other hooks read it.

    Args:
        log_plan (bool): print the plan table before training. Defaults to True.
    """

    priority = 'VERY_HIGH'  # convert the checkpoint before other hooks read it

    def __init__(self, log_plan: bool = True) -> None:
        self.log_plan = log_plan
        self.conversion: Optional[Dict[str, Any]] = None  # what the last resume changed

    def before_train(self, runner) -> None:
        """Log the plan the runner trains with (``log_plan``)."""
        if self.log_plan:
            runner.logger.info('\n' + format_plan(runtime_plan(runner)))

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        """Record the plan and the samples seen in the checkpoint's ``meta``."""
        plan = runtime_plan(runner)
        meta = checkpoint.setdefault('meta', {})
        meta[META_KEY] = plan.to_dict()
        meta['samples_seen'] = int(meta.get('iter', runner.iter)) * plan.samples_per_iter

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        """On resume under another plan: convert the checkpoint's iteration and
        schedule to this plan (in place, before the runner restores them)."""
        meta = checkpoint.get('meta') or {}
        if not getattr(runner, '_resume', False) or 'iter' not in meta:
            return  # loading weights only: the schedule starts from scratch
        if META_KEY not in meta:
            runner.logger.info('ScalingPlanHook: the checkpoint has no scaling plan '
                               '(saved without this hook); its iteration is kept as is.')
            return
        old = ScalingPlan.from_dict(meta[META_KEY])
        new = runtime_plan(runner)
        if not same_plan(old, new):
            self._convert(runner, checkpoint, old, new)

    # ------------------------------------------------------------------ conversion
    @staticmethod
    def _new_iter(runner, meta: dict, old: ScalingPlan, new: ScalingPlan) -> int:
        if isinstance(runner.train_loop, EpochBasedTrainLoop):
            # the loop restarts the saved epoch from its first batch
            return int(meta.get('epoch', 0)) * len(runner.train_dataloader)
        return convert_step(int(meta['iter']), old, new)

    def _convert(self, runner, checkpoint: dict, old: ScalingPlan,
                 new: ScalingPlan) -> None:
        meta = checkpoint['meta']
        old_iter = int(meta['iter'])
        new_iter = self._new_iter(runner, meta, old, new)
        meta['iter'] = new_iter
        notes = [f'iteration {old_iter} -> {new_iter}']
        if old_iter % old.accumulation:
            notes.append(f'checkpoint was {old_iter % old.accumulation} micro-batches into '
                         f'an accumulation window of {old.accumulation}: resuming at the '
                         'window start')
        if old.total_batch != new.total_batch:
            runner.logger.warning(
                f'ScalingPlanHook: the effective batch changed from {old.total_batch} to '
                f'{new.total_batch}; the resume keeps the number of samples seen, not the '
                'number of optimizer steps.')
        if old.lr_scale != new.lr_scale:
            notes.append(f'LR scale x {old.lr_scale:.6g} -> x {new.lr_scale:.6g}')
        notes += self._replay_schedule(runner, checkpoint, new, new_iter)
        self.conversion = dict(old=old.to_dict(), new=new.to_dict(), old_iter=old_iter,
                               new_iter=new_iter,
                               samples_seen=new_iter * new.samples_per_iter)
        runner.logger.info(
            'ScalingPlanHook: resuming a checkpoint saved with '
            f'{old.world_size} GPU(s) x {old.per_gpu_batch} x {old.accumulation} on '
            f'{new.world_size} GPU(s) x {new.per_gpu_batch} x {new.accumulation}: '
            + '; '.join(notes) + f'; samples seen: {new_iter * new.samples_per_iter}.')

    def _replay_schedule(self, runner, checkpoint: dict, new: ScalingPlan,
                         new_iter: int) -> List[str]:
        """Replace the checkpoint's scheduler states and scheduled param-group values
        by those of an uninterrupted run with ``new`` at ``new_iter``."""
        kept = ScheduleReplay(runner, new.accumulation).run(new_iter)
        saved = checkpoint.get('param_schedulers')
        names = {'lr'}
        for name, schedulers in _scheduler_lists(runner.param_schedulers):
            states = saved.get(name) if isinstance(saved, dict) else saved
            for i, sched in enumerate(schedulers):
                names.add(sched.param_name)
                if states is not None and i < len(states) and not getattr(
                        sched, 'need_val_args', False):
                    states[i] = sched.state_dict()
        for wrapper, state in _wrappers_with_state(runner, checkpoint):
            for live, group in zip(wrapper.optimizer.param_groups, state['param_groups']):
                for key in _scheduled_keys(live, names):
                    group[key] = copy.deepcopy(live[key])
        if kept:
            runner.logger.warning(
                f'ScalingPlanHook: {", ".join(kept)} follow(s) validation metrics and '
                'cannot be replayed for the new plan; its saved state is kept, and the '
                'LR it had lowered is not reapplied.')
        return [f'schedulers and LR replayed to iteration {new_iter} of this plan '
                f'(lr {_lrs(runner)})']


def _scheduled_keys(group: dict, names: set) -> List[str]:
    """Param-group keys the plan or a scheduler sets: ``x`` and ``initial_x``."""
    keys = [k for n in names for k in (n, f'initial_{n}') if k in group]
    if 'momentum' in names and 'betas' in group:
        keys.append('betas')  # Adam: mmengine's momentum schedulers set betas[0]
    return keys


def _lrs(runner) -> str:
    wrapper = runner.optim_wrapper
    wrappers = wrapper.values() if isinstance(wrapper, OptimWrapperDict) else [wrapper]
    return ', '.join(f'{g["lr"]:.6g}' for w in wrappers
                     for g in w.optimizer.param_groups)
