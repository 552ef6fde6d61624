"""One recipe for any GPU count: total batch -> per-GPU batch x GPUs x accumulation.

A config states what it wants once::

    scaling = dict(
        total_batch_size=32,        # samples per optimizer step, all GPUs together
        base_batch_size=32,         # total batch the LR in the config was tuned for
        lr_scaling='linear',        # 'linear' | 'sqrt' | 'none'
        per_gpu_batch_size=None,    # None: as large as allowed (see below)
        max_per_gpu_batch_size=None,  # None: the config's train_dataloader.batch_size
        bn_momentum='per_step',     # 'per_step' | 'per_forward' (BatchNorm statistics)
        memory_budget=None,         # '24GiB': fastest batch / checkpointing that fits
    )

and :func:`apply_scaling_recipe` (a :func:`prepare_config` step) derives the per-GPU
batch and the gradient accumulation from the world size, scales the LR by the real
effective batch (mmengine's ``auto_scale_lr`` ignores accumulation), and converts
iteration counts so they keep meaning *optimizer steps*. Conventions (documented in
``docs/scaling_guide.md``):

- iteration counts in the config (``train_cfg.max_iters``, ``val_interval``,
  ``val_begin``, ``dynamic_intervals``, an iteration-based checkpoint ``interval`` and
  ``save_begin`` (so that checkpoints land on window ends) and,
  when parameter schedulers step once per loop iteration as in stock mmengine, their
  ``begin``/``end``/``T_max``/...) count optimizer steps; the loop counts micro-batches,
  so they are multiplied by the accumulation;
- absolute LR values of LR schedulers (``eta_min``, ``eta_max``, ``min_value``) are
  scaled with the LR; relative ones (``eta_min_ratio``, factors, ``gamma``) are not;
  momentum and weight-decay schedulers are left alone;
- BatchNorm momentum is read per optimizer step (``bn_momentum='per_step'``): the
  ScalingRunner converts it per forward pass on the built model
  (:mod:`mmdet3d_scaling.engine.batchnorm_momentum`); ``'per_forward'`` keeps it.
"""
import copy
import math
from dataclasses import asdict, dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from mmengine.config import Config, ConfigDict
from mmengine.logging import print_log

from ..utils.registry_scope import type_name
from .validators import positive_int as _positive_int

LR_SCALINGS = ('linear', 'sqrt', 'none')
SCALING_KEYS = ('total_batch_size', 'base_batch_size', 'lr_scaling',
                'per_gpu_batch_size', 'max_per_gpu_batch_size', 'bn_momentum',
                'memory_budget')
BN_MOMENTUM_MODES = ('per_step', 'per_forward')
# Where apply_plan records what it did, so that applying again (a prepared config
# prepared twice, or a new plan at runtime) starts from the user's values.
RECORD_KEY = 'scaling_plan'
ABSENT = '<absent>'  # recorded original of a key apply_plan added

Path = Tuple[Any, ...]


@dataclass
class ScalingPlan:
    """How one optimizer step's batch is split over GPUs and micro-batches.

    Args:
        world_size: number of processes (GPUs).
        per_gpu_batch: samples per GPU per forward/backward (micro-batch).
        accumulation: micro-batches per optimizer step.
        total_batch: samples per optimizer step, all GPUs together
            (= world_size x per_gpu_batch x accumulation).
        base_batch: total batch the configured LR was tuned for.
        lr_scaling: rule from total/base to the LR factor: 'linear', 'sqrt', 'none'.
        lr_scale: factor applied to the configured LR values.
    """
    world_size: int
    per_gpu_batch: int
    accumulation: int
    total_batch: int
    base_batch: int
    lr_scaling: str
    lr_scale: float

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> 'ScalingPlan':
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})

    @property
    def samples_per_iter(self) -> int:
        """Samples all GPUs together consume in one loop iteration (micro-step)."""
        return self.world_size * self.per_gpu_batch


# --------------------------------------------------------------------------- planning
def nearest_multiples(value: int, step: int) -> List[int]:
    """The multiples of ``step`` just below and just above ``value`` (positive ones)."""
    below = (value // step) * step
    above = below if below == value else below + step
    return sorted({v for v in (below, above) if v > 0})


def _divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def lr_factor(total_batch: int, base_batch: int, lr_scaling: str) -> float:
    """LR multiplier for ``total_batch`` when the LR was tuned for ``base_batch``."""
    if lr_scaling not in LR_SCALINGS:
        raise ValueError(f'scaling.lr_scaling={lr_scaling!r} is not one of '
                         f'{", ".join(LR_SCALINGS)}')
    ratio = total_batch / base_batch
    return {'linear': ratio, 'sqrt': math.sqrt(ratio), 'none': 1.0}[lr_scaling]


def make_plan(total_batch_size: int,
              world_size: int,
              per_gpu_batch: Optional[int] = None,
              max_per_gpu_batch: Optional[int] = None,
              base_batch_size: Optional[int] = None,
              lr_scaling: str = 'linear') -> ScalingPlan:
    """Split ``total_batch_size`` over ``world_size`` GPUs and accumulation steps.

    Args:
        total_batch_size: samples per optimizer step, all GPUs together.
        world_size: number of processes.
        per_gpu_batch: fixed micro-batch per GPU; None picks the largest divisor of
            ``total_batch_size / world_size`` that is <= ``max_per_gpu_batch``.
        max_per_gpu_batch: most samples a GPU can take at once (memory); None: no cap.
        base_batch_size: total batch the LR was tuned for; None: ``total_batch_size``
            (LR unchanged).
        lr_scaling: 'linear', 'sqrt' or 'none'.

    Raises:
        ValueError: the numbers do not split evenly or break the cap; the message
            names the numbers and the nearest valid totals.
    """
    total = _positive_int('total_batch_size', total_batch_size)
    world = _positive_int('world_size', world_size)
    base = total if base_batch_size is None else _positive_int('base_batch_size',
                                                                base_batch_size)
    cap = None if max_per_gpu_batch is None else _positive_int('max_per_gpu_batch_size',
                                                                max_per_gpu_batch)
    scale = lr_factor(total, base, lr_scaling)
    if total % world:
        raise ValueError(
            f'total_batch_size={total} cannot be split evenly over {world} GPUs: it '
            f'must be a multiple of the world size. Nearest valid totals: '
            f'{_join(nearest_multiples(total, world))}.')
    per_rank = total // world
    if per_gpu_batch is not None:
        per_gpu = _positive_int('per_gpu_batch_size', per_gpu_batch)
        if cap is not None and per_gpu > cap:
            raise ValueError(
                f'per_gpu_batch_size={per_gpu} is above the per-GPU cap '
                f'max_per_gpu_batch_size={cap}: lower per_gpu_batch_size to <= {cap} '
                'or raise the cap if the GPU memory allows.')
        if per_rank % per_gpu:
            raise ValueError(
                f'total_batch_size={total} over {world} GPUs is {per_rank} samples per '
                f'GPU per optimizer step, which per_gpu_batch_size={per_gpu} does not '
                f'divide. Nearest valid totals with this per-GPU batch: '
                f'{_join(nearest_multiples(total, world * per_gpu))}; or use a per-GPU '
                f'batch that divides {per_rank}: {_join(_divisors(per_rank))}.')
    else:
        allowed = [d for d in _divisors(per_rank) if cap is None or d <= cap]
        per_gpu = max(allowed)  # 1 always divides, so never empty
    return ScalingPlan(world_size=world, per_gpu_batch=per_gpu,
                       accumulation=per_rank // per_gpu, total_batch=total,
                       base_batch=base, lr_scaling=lr_scaling, lr_scale=scale)


def _join(values: Sequence[int]) -> str:
    return ', '.join(str(v) for v in values)


def plan_hint(plan: ScalingPlan, max_per_gpu_batch: Optional[int]) -> Optional[str]:
    """A suggestion when the per-GPU batch had to stay well below the cap."""
    if max_per_gpu_batch is None or plan.per_gpu_batch * 2 > max_per_gpu_batch:
        return None
    step = plan.world_size * max_per_gpu_batch
    return (f'per-GPU batch {plan.per_gpu_batch} is well below the cap '
            f'{max_per_gpu_batch} because {plan.total_batch // plan.world_size} samples '
            f'per GPU have no larger divisor <= {max_per_gpu_batch}; totals '
            f'{_join(nearest_multiples(plan.total_batch, step))} would use the full '
            'per-GPU batch with fewer accumulation steps.')


def format_plan(plan: ScalingPlan) -> str:
    """The plan as a small table, printed at the start of training."""
    rows = [
        ('GPUs (world size)', str(plan.world_size)),
        ('batch per GPU', str(plan.per_gpu_batch)),
        ('accumulation steps', str(plan.accumulation)),
        ('total batch / optimizer step',
         f'{plan.total_batch} = {plan.world_size} x {plan.per_gpu_batch} x '
         f'{plan.accumulation}'),
        ('LR tuned for total batch', str(plan.base_batch)),
        ('LR scaling', f'{plan.lr_scaling}: x {plan.lr_scale:.6g}'),
    ]
    width = max(len(k) for k, _ in rows)
    vwidth = max(len(v) for _, v in rows)
    line = '+' + '-' * (width + 2) + '+' + '-' * (vwidth + 2) + '+'
    body = [f'| {k.ljust(width)} | {v.ljust(vwidth)} |' for k, v in rows]
    return '\n'.join(['Scaling plan', line, *body, line])


# ------------------------------------------------------------------ config traversal
def _get(cfg: Any, path: Path) -> Any:
    for key in path:
        cfg = cfg[key]
    return cfg


def _set(cfg: Any, path: Path, value: Any) -> None:
    _get(cfg, path[:-1])[path[-1]] = value


def _optimizer_paths(cfg: Config) -> List[Path]:
    """Paths of the optimizer dicts: one wrapper, or each wrapper of a dict of them."""
    optim = cfg.get('optim_wrapper')
    if not isinstance(optim, dict):
        return []
    if 'optimizer' in optim:
        return [('optim_wrapper', 'optimizer')]
    return [('optim_wrapper', name, 'optimizer') for name, sub in optim.items()
            if isinstance(sub, dict) and 'optimizer' in sub]


def _scheduler_paths(cfg: Config) -> Iterator[Path]:
    """Paths of every scheduler dict in ``param_scheduler`` (dict, list, dict of lists)."""

    def walk(node: Any, path: Path) -> Iterator[Path]:
        if isinstance(node, dict) and 'type' in node:
            yield path
        elif isinstance(node, dict):
            for key, sub in node.items():
                yield from walk(sub, path + (key,))
        elif isinstance(node, (list, tuple)):
            for i, sub in enumerate(node):
                yield from walk(sub, path + (i,))

    yield from walk(cfg.get('param_scheduler'), ('param_scheduler',))


def _is_lr_scheduler(sched: dict) -> bool:
    """LR schedulers (``*LR`` or a generic one with ``param_name='lr'``)."""
    if sched.get('param_name') == 'lr':
        return True
    kind = sched['type']
    cls = kind
    if isinstance(kind, str):
        from mmdet3d.registry import PARAM_SCHEDULERS
        cls = PARAM_SCHEDULERS.get(kind)
        if cls is None:
            return kind.endswith('LR')
    from mmengine.optim.scheduler.lr_scheduler import LRSchedulerMixin
    return isinstance(cls, type) and issubclass(cls, LRSchedulerMixin)


ABSOLUTE_LR_FIELDS = ('eta_min', 'eta_max', 'min_value')
#: CheckpointHook arguments that count loop iterations when it saves by iteration
CHECKPOINT_STEP_FIELDS = ('interval', 'save_begin')
STEP_COUNT_FIELDS = ('begin', 'end', 'T_max', 'step_size', 'milestones', 'total_steps',
                     'periods')


def scheduler_unit(cfg: Config) -> str:
    """What one parameter-scheduler step is: 'iteration' (stock mmengine: every loop
    iteration, i.e. every micro-batch) or 'optimizer_step'.

    A replacement ``default_hooks.param_scheduler`` hook that steps schedulers once per
    optimizer step declares it with a class attribute ``scheduler_unit =
    'optimizer_step'``.
    """
    hook = (cfg.get('default_hooks') or {}).get('param_scheduler')
    kind = hook.get('type') if isinstance(hook, dict) else None
    if isinstance(kind, str):
        from mmdet3d.registry import HOOKS
        kind = HOOKS.get(kind)
    return getattr(kind, 'scheduler_unit', 'iteration')


def _lr_targets(cfg: Config) -> List[Path]:
    paths = [p + ('lr',) for p in _optimizer_paths(cfg) if 'lr' in _get(cfg, p)]
    for path in _scheduler_paths(cfg):
        sched = _get(cfg, path)
        if _is_lr_scheduler(sched):
            paths += [path + (f,) for f in ABSOLUTE_LR_FIELDS
                      if sched.get(f) is not None]
    return paths


def _iteration_targets(cfg: Config) -> List[Path]:
    """Iteration counts that must grow with the accumulation to mean optimizer steps."""
    paths: List[Path] = []
    train_cfg = cfg.get('train_cfg') or {}
    if train_cfg.get('type') == 'IterBasedTrainLoop' or (
            'max_iters' in train_cfg and 'max_epochs' not in train_cfg):
        paths += [('train_cfg', k) for k in ('max_iters', 'val_begin', 'val_interval',
                                             'dynamic_intervals') if k in train_cfg]
    ckpt = (cfg.get('default_hooks') or {}).get('checkpoint')
    if isinstance(ckpt, dict) and ckpt.get('by_epoch') is False:
        # both, or a checkpoint lands inside an accumulation window (save_begin=5
        # optimizer steps with interval 2 x accumulation saves at odd micro-steps)
        paths += [('default_hooks', 'checkpoint', k) for k in CHECKPOINT_STEP_FIELDS
                  if k in ckpt]
    if scheduler_unit(cfg) == 'iteration':
        for path in _scheduler_paths(cfg):
            sched = _get(cfg, path)
            if sched.get('by_epoch', True) is False:
                paths += [path + (f,) for f in STEP_COUNT_FIELDS if f in sched]
    return paths


def _scale(value: Any, factor: float, as_int: bool) -> Any:
    if isinstance(value, (list, tuple)):
        return type(value)(_scale(v, factor, as_int) for v in value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if as_int:
        # INF-like ends (e.g. end=sys.maxsize) stay as they are
        return value if value >= 2**31 else int(round(value * factor))
    return value * factor


# ------------------------------------------------------------------------- applying
def _restore(cfg: Config) -> None:
    record = cfg.get(RECORD_KEY)
    if not record:
        return
    for path, value in record['original']:
        if value == ABSENT:
            _get(cfg, tuple(path[:-1])).pop(path[-1], None)
        else:
            _set(cfg, tuple(path), copy.deepcopy(value))
    cfg.pop(RECORD_KEY)


def apply_plan(cfg: Config, plan: ScalingPlan) -> Config:
    """Write ``plan`` into ``cfg`` (in place): batch, accumulation, LR, iteration counts.

    Re-applying (with the same or another plan) first restores the values the previous
    application changed, so a prepared config can be prepared again and a runtime
    component (the auto batch size finder) can replace the plan.
    """
    _restore(cfg)
    lr_paths = _lr_targets(cfg)
    iter_paths = _iteration_targets(cfg) if plan.accumulation > 1 else []
    batch_path = ('train_dataloader', 'batch_size')
    acc_path = ('optim_wrapper', 'accumulative_counts')
    original = [(list(p), copy.deepcopy(_get(cfg, p)))
                for p in [batch_path] + lr_paths + iter_paths]
    if 'accumulative_counts' in cfg.optim_wrapper:
        original.append((list(acc_path), cfg.optim_wrapper.accumulative_counts))

    _set(cfg, batch_path, plan.per_gpu_batch)
    if plan.accumulation > 1 or 'accumulative_counts' in cfg.optim_wrapper:
        _set(cfg, acc_path, plan.accumulation)
        if not any(p == list(acc_path) for p, _ in original):
            original.append((list(acc_path), ABSENT))
    for path in lr_paths:
        _set(cfg, path, _scale(_get(cfg, path), plan.lr_scale, as_int=False))
    for path in iter_paths:
        _set(cfg, path, _scale(_get(cfg, path), plan.accumulation, as_int=True))
    cfg[RECORD_KEY] = dict(plan=plan.to_dict(), original=original,
                           lr_fields=['.'.join(map(str, p)) for p in lr_paths],
                           iteration_fields=['.'.join(map(str, p)) for p in iter_paths])
    return cfg


def recorded_plan(cfg: Config) -> Optional[ScalingPlan]:
    """The plan :func:`apply_plan` wrote into ``cfg``, if any."""
    record = cfg.get(RECORD_KEY)
    return ScalingPlan.from_dict(record['plan']) if record else None


def _original_value(cfg: Config, path: Path, default: Any = None) -> Any:
    """A value as the user wrote it (before a previous apply_plan changed it)."""
    record = cfg.get(RECORD_KEY) or {}
    for p, value in record.get('original', []):
        if tuple(p) == path:
            return default if value == ABSENT else value
    try:
        return _get(cfg, path)
    except (KeyError, IndexError, TypeError):
        return default


def _user_accumulation(cfg: Config) -> int:
    counts = _original_value(cfg, ('optim_wrapper', 'accumulative_counts'), 1)
    legacy = (cfg.get('optimizer_config') or {}).get('cumulative_iters', 1)
    return max(counts or 1, legacy or 1)


def _check_scaling_keys(scaling: dict) -> None:
    unknown = sorted(set(scaling) - set(SCALING_KEYS))
    if unknown:
        raise ValueError(f'unknown key(s) in scaling: {", ".join(unknown)}; known keys: '
                         f'{", ".join(SCALING_KEYS)}')
    if 'total_batch_size' not in scaling:
        raise ValueError('scaling needs total_batch_size (samples per optimizer step, '
                         'all GPUs together).')
    mode = scaling.get('bn_momentum', BN_MOMENTUM_MODES[0])
    if mode not in BN_MOMENTUM_MODES:
        raise ValueError(
            f'scaling.bn_momentum={mode!r} is not one of {", ".join(BN_MOMENTUM_MODES)}: '
            "'per_step' reads the BatchNorm momentum per optimizer step (converted for "
            "the accumulation), 'per_forward' keeps it per forward pass.")


def base_batch_size(cfg: Config) -> Optional[int]:
    """The total batch the config's LR was tuned for: ``scaling.base_batch_size``, else
    ``auto_scale_lr.base_batch_size``; None: the total batch (LR unchanged)."""
    auto = cfg.get('auto_scale_lr') or {}
    return (cfg.get('scaling') or {}).get('base_batch_size', auto.get('base_batch_size'))


def plan_from_config(cfg: Config, world_size: int) -> ScalingPlan:
    """The plan ``cfg.scaling`` asks for on ``world_size`` GPUs."""
    scaling = dict(cfg.scaling)
    _check_scaling_keys(scaling)
    base = base_batch_size(cfg)
    cap = scaling.get('max_per_gpu_batch_size')
    if cap is None and scaling.get('per_gpu_batch_size') is None:
        cap = _original_value(cfg, ('train_dataloader', 'batch_size'))
    return make_plan(scaling['total_batch_size'], world_size,
                     per_gpu_batch=scaling.get('per_gpu_batch_size'),
                     max_per_gpu_batch=cap, base_batch_size=base,
                     lr_scaling=scaling.get('lr_scaling', 'linear'))


def _fold_auto_scale_lr(cfg: Config, world_size: int) -> None:
    """``auto_scale_lr.enable`` without ``scaling``: scale the LR by the real effective
    batch (per-GPU batch x GPUs x accumulation) instead of mmengine's rule, which
    leaves the accumulation out."""
    auto = cfg.get('auto_scale_lr') or {}
    if not auto.get('enable', False):
        return
    if 'base_batch_size' not in auto:
        raise ValueError('auto_scale_lr.enable=True needs auto_scale_lr.base_batch_size '
                         '(the total batch size the LR was tuned for).')
    per_gpu = cfg.train_dataloader.batch_size
    acc = _user_accumulation(cfg)
    plan = make_plan(per_gpu * world_size * acc, world_size, per_gpu_batch=per_gpu,
                     base_batch_size=auto['base_batch_size'], lr_scaling='linear')
    for path in _lr_targets(cfg):
        _set(cfg, path, _scale(_get(cfg, path), plan.lr_scale, as_int=False))
    cfg.auto_scale_lr.enable = False
    print_log(f'auto_scale_lr: effective batch {plan.total_batch} = {world_size} GPUs x '
              f'{per_gpu} x {acc} accumulation, LR tuned for {plan.base_batch}: LR '
              f'x {plan.lr_scale:.6g} (mmengine\'s own rule, which ignores accumulation, '
              'is switched off).', logger='current')


def planned(cfg: Config, world_size: int) -> Optional[ScalingPlan]:
    """The plan the config's ``scaling`` asks for on ``world_size`` GPUs (None without
    ``scaling``)."""
    if not cfg.get('scaling'):
        return None
    return plan_from_config(cfg, world_size)


def accumulation_in_force(cfg: Config, plan: Optional[ScalingPlan]) -> Optional[int]:
    """The accumulation the earlier config steps must agree with: the recorded plan's in
    a config prepared before (a run-time replan records its own), else ``plan``'s."""
    record = cfg.get(RECORD_KEY)
    if isinstance(record, dict) and isinstance(record.get('plan'), dict):
        return record['plan'].get('accumulation')
    return plan.accumulation if plan is not None else None


def apply_scaling_recipe(cfg: Config, world_size: int,
                         plan: Optional[ScalingPlan] = None) -> Config:
    """``prepare_config`` step: turn ``cfg.scaling`` into batch/accumulation/LR settings.

    Without ``scaling``: only ``auto_scale_lr`` is corrected for accumulation.
    ``plan``: :func:`planned` for this config when the caller has it already.
    """
    if not cfg.get('scaling'):
        _fold_auto_scale_lr(cfg, world_size)
        return cfg
    if (cfg.get('auto_scale_lr') or {}).get('enable', False):
        raise ValueError(
            'auto_scale_lr.enable=True and scaling are both set: scaling already scales '
            'the LR by the real effective batch (scaling.lr_scaling / base_batch_size). '
            'Remove auto_scale_lr.enable (or --auto-scale-lr) or remove scaling.')
    previous = recorded_plan(cfg)
    user_acc = _user_accumulation(cfg)
    if previous is None and user_acc != 1:
        raise ValueError(
            f'scaling derives the gradient accumulation from the world size, but the '
            f'config also sets it to {user_acc} (optim_wrapper.accumulative_counts or '
            'optimizer_config.cumulative_iters). Remove that setting and state the '
            'effective batch with scaling.total_batch_size.')
    plan = plan or plan_from_config(cfg, world_size)
    apply_plan(cfg, plan)
    cap = cfg.scaling.get('max_per_gpu_batch_size') or _original_value(
        cfg, ('train_dataloader', 'batch_size'))
    hint = plan_hint(plan, None if cfg.scaling.get('per_gpu_batch_size') else cap)
    if hint:
        print_log(f'scaling: {hint}', logger='current')
    _add_plan_hook(cfg)
    return cfg


def _hook_type(hook: Any) -> str:
    return type_name(hook.get('type') if isinstance(hook, dict) else type(hook))


#: hooks that save an unfinished accumulation window's gradients in checkpoints
WINDOW_CHECKPOINT_HOOKS = ('AccumulationCheckpointHook', 'GradientCumulativeOptimizerHook')


def _add_plan_hook(cfg: Config) -> None:
    """The plan hook (plan in checkpoints, conversion on resume) and the hook that puts
    an unfinished window's gradients into a checkpoint (a checkpoint can still land
    inside a window: an interval that is not a multiple, ``save_last``, a plan raised
    at run time by the auto batch size search)."""
    hooks = list(cfg.get('custom_hooks') or [])
    types = {_hook_type(h) for h in hooks}
    if 'ScalingPlanHook' not in types:
        hooks.append(ConfigDict(type='ScalingPlanHook'))
    if not types & set(WINDOW_CHECKPOINT_HOOKS):
        hooks.append(ConfigDict(type='AccumulationCheckpointHook'))
    cfg.custom_hooks = hooks
