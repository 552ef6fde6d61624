"""Writing a scaling plan into a config: per-GPU batch, accumulation, LR values and the
iteration counts that must keep meaning optimizer steps, recorded so that writing again
(a prepared config prepared twice, a plan replaced at run time) starts from the user's
values. The conventions are :mod:`.scaling_recipe`'s.
"""
import copy
from typing import Any, Iterator, List, Optional, Tuple

from mmengine.config import Config

from .scaling_plan import ScalingPlan

# Where apply_plan records what it did, so that applying again (a prepared config
# prepared twice, or a new plan at runtime) starts from the user's values.
RECORD_KEY = 'scaling_plan'
ABSENT = '<absent>'  # recorded original of a key apply_plan added

Path = Tuple[Any, ...]


def get_path(cfg: Any, path: Path) -> Any:
    for key in path:
        cfg = cfg[key]
    return cfg


def set_path(cfg: Any, path: Path, value: Any) -> None:
    get_path(cfg, path[:-1])[path[-1]] = value


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


def lr_targets(cfg: Config) -> List[Path]:
    paths = [p + ('lr',) for p in _optimizer_paths(cfg) if 'lr' in get_path(cfg, p)]
    for path in _scheduler_paths(cfg):
        sched = get_path(cfg, path)
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
            sched = get_path(cfg, path)
            if sched.get('by_epoch', True) is False:
                paths += [path + (f,) for f in STEP_COUNT_FIELDS if f in sched]
    return paths


def scale_value(value: Any, factor: float, as_int: bool) -> Any:
    if isinstance(value, (list, tuple)):
        return type(value)(scale_value(v, factor, as_int) for v in value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if as_int:
        # INF-like ends (e.g. end=sys.maxsize) stay as they are
        return value if value >= 2**31 else int(round(value * factor))
    return value * factor


def _restore(cfg: Config) -> None:
    record = cfg.get(RECORD_KEY)
    if not record:
        return
    for path, value in record['original']:
        if value == ABSENT:
            get_path(cfg, tuple(path[:-1])).pop(path[-1], None)
        else:
            set_path(cfg, tuple(path), copy.deepcopy(value))
    cfg.pop(RECORD_KEY)


def apply_plan(cfg: Config, plan: ScalingPlan) -> Config:
    """Write ``plan`` into ``cfg`` (in place): batch, accumulation, LR, iteration counts.

    Re-applying (with the same or another plan) first restores the values the previous
    application changed, so a prepared config can be prepared again and a runtime
    component (the auto batch size finder) can replace the plan.
    """
    _restore(cfg)
    lr_paths = lr_targets(cfg)
    iter_paths = _iteration_targets(cfg) if plan.accumulation > 1 else []
    batch_path = ('train_dataloader', 'batch_size')
    acc_path = ('optim_wrapper', 'accumulative_counts')
    original = [(list(p), copy.deepcopy(get_path(cfg, p)))
                for p in [batch_path] + lr_paths + iter_paths]
    if 'accumulative_counts' in cfg.optim_wrapper:
        original.append((list(acc_path), cfg.optim_wrapper.accumulative_counts))

    set_path(cfg, batch_path, plan.per_gpu_batch)
    if plan.accumulation > 1 or 'accumulative_counts' in cfg.optim_wrapper:
        set_path(cfg, acc_path, plan.accumulation)
        if not any(p == list(acc_path) for p, _ in original):
            original.append((list(acc_path), ABSENT))
    for path in lr_paths:
        set_path(cfg, path, scale_value(get_path(cfg, path), plan.lr_scale, as_int=False))
    for path in iter_paths:
        set_path(cfg, path, scale_value(get_path(cfg, path), plan.accumulation, as_int=True))
    cfg[RECORD_KEY] = dict(plan=plan.to_dict(), original=original,
                           lr_fields=['.'.join(map(str, p)) for p in lr_paths],
                           iteration_fields=['.'.join(map(str, p)) for p in iter_paths])
    return cfg


def recorded_plan(cfg: Config) -> Optional[ScalingPlan]:
    """The plan :func:`apply_plan` wrote into ``cfg``, if any."""
    record = cfg.get(RECORD_KEY)
    return ScalingPlan.from_dict(record['plan']) if record else None


def original_value(cfg: Config, path: Path, default: Any = None) -> Any:
    """A value as the user wrote it (before a previous apply_plan changed it)."""
    record = cfg.get(RECORD_KEY) or {}
    for p, value in record.get('original', []):
        if tuple(p) == path:
            return default if value == ABSENT else value
    try:
        return get_path(cfg, path)
    except (KeyError, IndexError, TypeError):
        return default
