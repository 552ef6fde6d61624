"""Config rewrites as ``--cfg-options``: a shortened schedule that keeps its shape, a
moved data root, the logging every run shares, and their ``key=value`` form."""
from typing import Any, Dict, Iterable, List, Tuple

from .errors import ParityError, positive


#: scheduler fields that count iterations (scaled when ``iters`` shortens the run)
STEP_FIELDS = ('begin', 'end', 'T_max', 'step_size', 'milestones', 'total_steps')


def schedule_overrides(cfg: Any, iters: int) -> Dict[str, Any]:
    """``--cfg-options`` that shorten an iteration-based schedule to ``iters`` steps.

    Scheduler ``begin``/``end``/``T_max``/... of ``by_epoch=False`` schedulers are
    scaled by ``iters / max_iters`` (the schedule keeps its shape), checkpoints and
    validation land on the last step.

    Raises:
        ParityError: the config's loop is not iteration-based.
    """
    iters = positive('--iters', iters)
    train_cfg = cfg.get('train_cfg') or {}
    old = train_cfg.get('max_iters')
    if not old:
        raise ParityError(
            f'--iters needs an iteration-based config (train_cfg.max_iters); this one '
            f'has train_cfg={dict(train_cfg)!r}. Leave --iters out to train its own '
            'schedule.')
    out: Dict[str, Any] = {'train_cfg.max_iters': iters}
    if 'val_interval' in train_cfg:
        out['train_cfg.val_interval'] = iters
    ckpt = (cfg.get('default_hooks') or {}).get('checkpoint') or {}
    if ckpt.get('by_epoch') is False:
        out['default_hooks.checkpoint.interval'] = iters
    scheds = cfg.get('param_scheduler') or []
    scheds = [scheds] if isinstance(scheds, dict) else scheds
    for i, sched in enumerate(scheds):
        if sched.get('by_epoch', True) is not False:
            continue
        for name in STEP_FIELDS:
            if name in sched:
                out[f'param_scheduler.{i}.{name}'] = _rescale(sched[name], iters / old)
    return out


def _rescale(value: Any, factor: float) -> Any:
    if isinstance(value, (list, tuple)):
        return [_rescale(v, factor) for v in value]
    if isinstance(value, bool) or not isinstance(value, int) or value >= 2**31:
        return value
    return 0 if value == 0 else max(1, int(round(value * factor)))


def data_root_overrides(cfg: Any, data_root: str) -> Dict[str, Any]:
    """``--cfg-options`` moving every path under ``cfg.data_root`` to ``data_root``.

    ``data_root`` is interpolated into the dataset, sampler and evaluator paths when the
    config is parsed, so overriding ``data_root`` alone changes nothing else.
    """
    old = cfg.get('data_root')
    if not old:
        raise ParityError('--data-root needs a config with a data_root key')
    new = data_root.rstrip('/') + '/'
    out: Dict[str, Any] = {'data_root': new}
    for path, value in walk(cfg.to_dict() if hasattr(cfg, 'to_dict') else cfg, ''):
        if isinstance(value, str) and value.startswith(old) and path != 'data_root':
            out[path] = new + value[len(old):]
    return out


def walk(node: Any, prefix: str) -> Iterable[Tuple[str, Any]]:
    if isinstance(node, dict):
        items = node.items()
    elif isinstance(node, (list, tuple)):
        items = enumerate(node)
    else:
        yield prefix, node
        return
    for key, sub in items:
        yield from walk(sub, f'{prefix}.{key}' if prefix else str(key))


#: every loop iteration logged with its own loss (the loss curve), no validation during
#: training (tools/test.py evaluates the last checkpoint)
COMMON_OVERRIDES = {'default_hooks.logger.interval': 1, 'log_processor.window_size': 1,
                    'val_cfg': None, 'val_dataloader': None, 'val_evaluator': None}


def format_options(options: Dict[str, Any]) -> List[str]:
    """``--cfg-options`` arguments (``key=value``) that DictAction parses back."""
    return [f'{k}={_format_value(v)}' for k, v in options.items()]


def _format_value(value: Any) -> str:
    if value is None:
        return 'None'
    if isinstance(value, (list, tuple)):
        return '[' + ','.join(_format_value(v) for v in value) + ']'
    return str(value)
