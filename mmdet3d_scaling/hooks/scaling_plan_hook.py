"""ScalingPlanHook: print the scaling plan, store it in checkpoints, and resume a
checkpoint on another GPU count at the same place in the schedule."""
from typing import Any, Dict, List, Optional

from mmengine.hooks import Hook

from mmdet3d.registry import HOOKS

from ..config.scaling_recipe import ScalingPlan, format_plan, recorded_plan, scheduler_unit
from ..engine.optim_state import accumulation
from ..registry import register

META_KEY = 'scaling_plan'


def runtime_plan(runner) -> ScalingPlan:
    """The plan the runner really uses: loader batch, world size, wrapper accumulation.

    Base batch and LR scaling come from the config's recorded plan when there is one.
    """
    per_gpu = runner.train_dataloader.batch_size
    world = runner.world_size
    acc = accumulation(runner.optim_wrapper)
    total = per_gpu * world * acc
    recorded = recorded_plan(runner.cfg) if runner.cfg is not None else None
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


@register(HOOKS)
class ScalingPlanHook(Hook):
    """Print the scaling plan at start, save it in checkpoints, convert on resume.

    Added by the ``scaling`` config recipe (``custom_hooks``); usable on its own.

    On resume, when the checkpoint's plan (world size, per-GPU batch, accumulation)
    differs from the current one, the iteration state is converted so that the number
    of samples seen and the LR match: ``runner.iter`` (the loop counts micro-batches)
    and the step counters of iteration-based parameter schedulers. Epoch-based loops
    resume at the saved epoch as usual. A checkpoint taken inside an accumulation window
    resumes at the window's start: the checkpoint holds no gradients of that window.

    Args:
        log_plan: print the plan table before training. Defaults to True.
    """

    priority = 'VERY_HIGH'  # convert the checkpoint before other hooks read it

    def __init__(self, log_plan: bool = True) -> None:
        self.log_plan = log_plan
        self.conversion: Optional[Dict[str, Any]] = None  # what the last resume changed

    def before_train(self, runner) -> None:
        if self.log_plan:
            runner.logger.info('\n' + format_plan(runtime_plan(runner)))

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        plan = runtime_plan(runner)
        meta = checkpoint.setdefault('meta', {})
        meta[META_KEY] = plan.to_dict()
        meta['samples_seen'] = int(meta.get('iter', runner.iter)) * plan.samples_per_iter

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        meta = checkpoint.get('meta') or {}
        if not getattr(runner, '_resume', False) or 'iter' not in meta:
            return  # loading weights only: the schedule starts from scratch
        if META_KEY not in meta:
            runner.logger.info('ScalingPlanHook: the checkpoint has no scaling plan '
                               '(saved without this hook); its iteration is kept as is.')
            return
        old = ScalingPlan.from_dict(meta[META_KEY])
        new = runtime_plan(runner)
        if (old.world_size, old.per_gpu_batch, old.accumulation) == (
                new.world_size, new.per_gpu_batch, new.accumulation):
            return
        self._convert(runner, checkpoint, old, new)

    # ------------------------------------------------------------------ conversion
    def _convert(self, runner, checkpoint: dict, old: ScalingPlan,
                 new: ScalingPlan) -> None:
        meta = checkpoint['meta']
        old_iter = int(meta['iter'])
        new_iter = convert_step(old_iter, old, new)
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
        notes += self._convert_schedulers(runner, checkpoint, old, new)
        self.conversion = dict(old=old.to_dict(), new=new.to_dict(), old_iter=old_iter,
                               new_iter=new_iter,
                               samples_seen=new_iter * new.samples_per_iter)
        runner.logger.info(
            'ScalingPlanHook: resuming a checkpoint saved with '
            f'{old.world_size} GPU(s) x {old.per_gpu_batch} x {old.accumulation} on '
            f'{new.world_size} GPU(s) x {new.per_gpu_batch} x {new.accumulation}: '
            + '; '.join(notes) + f'; samples seen: {new_iter * new.samples_per_iter}.')

    def _convert_schedulers(self, runner, checkpoint: dict, old: ScalingPlan,
                            new: ScalingPlan) -> List[str]:
        """Iteration-based scheduler states: the current run's structure (begin/end in
        this plan's iterations) with the step counter converted from the checkpoint."""
        saved = checkpoint.get('param_schedulers')
        live = runner.param_schedulers
        if not saved or live is None:
            return []
        per_micro_step = scheduler_unit(runner.cfg) == 'iteration'
        notes = []
        groups = saved.items() if isinstance(saved, dict) else [(None, saved)]
        for name, states in groups:
            schedulers = live[name] if name is not None else live
            for i, (state, sched) in enumerate(zip(states, schedulers)):
                if state.get('by_epoch', True) or isinstance(sched, dict):
                    continue  # epoch counters do not depend on the GPU count
                fresh = sched.state_dict()
                for key in ('last_step', '_global_step'):
                    if key not in state:
                        continue
                    value = int(state[key])
                    if value <= 0:
                        pass  # not started yet (-1) or at the start: nothing to scale
                    elif per_micro_step:
                        value = convert_step(value, old, new)
                    elif old.total_batch != new.total_batch:
                        value = value * old.total_batch // new.total_batch
                    fresh[key] = value
                label = f'{name}[{i}]' if name is not None else f'[{i}]'
                notes.append(f'scheduler {label} {type(sched).__name__} step '
                             f'{state.get("last_step")} -> {fresh.get("last_step")}')
                states[i] = fresh
        return notes
