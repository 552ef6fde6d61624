"""The config step of the batch size search: the keys that ask for a search, read once.

::

    scaling = dict(total_batch_size=32, per_gpu_batch_size='auto')  # auto batch size
    auto_batch_size = dict(margin=0.1)  # AutoBatchSizeHook's arguments; or True
    scaling = dict(total_batch_size=32, memory_budget='24GiB')  # the fastest fit

Each adds its hook to ``custom_hooks`` (a hook already there keeps its options) with
what this step resolved as arguments: ``recipe``, the batch settings of the scaling
recipe the search must keep, and for the fastest fit ``budget_bytes``, the memory
budget in bytes. The hooks read none of these keys again. The two searches both choose
the per-GPU batch, so asking for both is an error.

:func:`configure_batch_size_search` is a :func:`~mmdet3d_scaling.config.prepare_config`
step, registered when this package is imported; it runs before the scaling recipe,
which expects a number (or None) in ``scaling.per_gpu_batch_size``. Pure ``cfg -> cfg``
and idempotent.
"""
from typing import Any, Dict, List, Optional

from mmengine.config import Config, ConfigDict

from ..config.preparation import register_batch_step
from ..config.scaling_recipe import base_batch_size
from ..config.validators import merge
from ..utils.memory_size import parse_memory_budget
from ..utils.registry_scope import type_name

AUTO_HOOK = 'AutoBatchSizeHook'
FIT_HOOK = 'FastestFitHook'
CONFIG_KEY = 'auto_batch_size'


def _index(hooks: List[Any], name: str) -> Optional[int]:
    """Position of the ``name`` hook's config in ``hooks`` (any scope), or None."""
    for i, hook in enumerate(hooks):
        if isinstance(hook, dict) and type_name(hook.get('type')) == name:
            return i
    return None


def recipe_of(cfg: Config) -> Optional[Dict[str, Any]]:
    """What the scaling recipe fixes that a search must keep; None without a recipe.

    ``total_batch_size``, ``base_batch_size`` (None: the total), ``lr_scaling``,
    ``per_gpu_batch_size`` (a number fixes the batch; None: the search chooses) and
    ``max_per_gpu_batch_size`` (None: no cap).
    """
    scaling = cfg.get('scaling') or {}
    if 'total_batch_size' not in scaling:
        return None  # the recipe step names what is missing
    fixed = scaling.get('per_gpu_batch_size')
    return dict(total_batch_size=scaling['total_batch_size'],
                base_batch_size=base_batch_size(cfg),
                lr_scaling=scaling.get('lr_scaling', 'linear'),
                per_gpu_batch_size=None if fixed == 'auto' else fixed,
                max_per_gpu_batch_size=scaling.get('max_per_gpu_batch_size'))


def _auto_options(cfg: Config, wants_auto: bool) -> Optional[dict]:
    """``auto_batch_size`` (consumed) as AutoBatchSizeHook arguments; None: not asked."""
    options = cfg.pop(CONFIG_KEY, None)
    if options is False and wants_auto:
        raise ValueError(f"{CONFIG_KEY}=False contradicts scaling.per_gpu_batch_size="
                         "'auto': remove one of them.")
    if options is None or options is False:
        return {} if wants_auto else None
    if options is True:
        return {}
    if not isinstance(options, dict):
        raise ValueError(f'{CONFIG_KEY} must be a dict of {AUTO_HOOK} arguments '
                         f'or True/False, got {options!r}')
    return dict(options)


def _refuse_both(budget: Any, wants_auto: bool, asks_auto: bool) -> None:
    if wants_auto:
        raise ValueError(
            f"scaling.memory_budget={budget!r} (or {FIT_HOOK}) chooses the fastest "
            "per-GPU batch that fits, scaling.per_gpu_batch_size='auto' the largest: "
            'remove one of them (a number in per_gpu_batch_size fixes the batch and '
            'leaves only the checkpointing to choose).')
    if asks_auto:
        raise ValueError(
            f'scaling.memory_budget={budget!r} (or {FIT_HOOK}) chooses the per-GPU '
            f'batch, and so does {CONFIG_KEY} / {AUTO_HOOK}: remove one of them.')


def _fit_hook(entry: Optional[dict], budget: Any,
              recipe: Optional[Dict[str, Any]]) -> ConfigDict:
    """The FastestFitHook config with the budget in bytes and the recipe."""
    if recipe is None:
        raise ValueError(
            f'{FIT_HOOK} keeps the effective batch of the scaling recipe: add scaling = '
            'dict(total_batch_size=..., memory_budget=...) to the config.')
    hook = ConfigDict(entry or dict(type=FIT_HOOK))
    # the hook's own memory_budget (as users write it) is read here, once, too
    written = [(f'{FIT_HOOK} memory_budget', hook.pop('memory_budget', None)),
               ('scaling.memory_budget', budget)]
    parsed = [(where, None if value is None else parse_memory_budget(value, where))
              for where, value in written]
    parsed.append((f'{FIT_HOOK} budget_bytes', hook.get('budget_bytes')))
    hook.budget_bytes = merge('memory budget (bytes)', parsed)
    hook.recipe = recipe
    return hook


def _auto_hook(entry: Optional[dict], options: Optional[dict],
               recipe: Optional[Dict[str, Any]]) -> ConfigDict:
    """The AutoBatchSizeHook config with the recipe."""
    if entry is not None and options is not None:
        raise ValueError(f'{AUTO_HOOK} is in custom_hooks and also requested by '
                         f"{CONFIG_KEY} / scaling.per_gpu_batch_size='auto': configure "
                         'it in one place.')
    if recipe is not None and recipe['per_gpu_batch_size'] is not None:
        raise ValueError(
            f'{AUTO_HOOK} chooses the per-GPU batch, but scaling.per_gpu_batch_size='
            f"{recipe['per_gpu_batch_size']!r} fixes it: set it to 'auto' (or remove "
            'it), or remove the hook.')
    hook = ConfigDict(entry or dict(type=AUTO_HOOK, **options))
    hook.recipe = recipe
    return hook


def _put(hooks: List[Any], at: Optional[int], hook: ConfigDict) -> None:
    if at is None:
        hooks.append(hook)
    else:
        hooks[at] = hook


def configure_batch_size_search(cfg: Config) -> Config:
    """Turn the search keys into one hook with resolved arguments (see the module)."""
    scaling = cfg.get('scaling') or {}
    wants_auto = scaling.get('per_gpu_batch_size') == 'auto'
    budget = scaling.get('memory_budget')
    hooks = list(cfg.get('custom_hooks') or [])
    fit_at, auto_at = _index(hooks, FIT_HOOK), _index(hooks, AUTO_HOOK)
    options = _auto_options(cfg, wants_auto)
    wants_fit = budget is not None or fit_at is not None
    if not wants_fit and options is None and auto_at is None:
        return cfg
    if wants_fit:
        _refuse_both(budget, wants_auto,
                     asks_auto=options is not None or auto_at is not None)
    if wants_auto:
        cfg.scaling.per_gpu_batch_size = None  # the recipe's start; the hook replaces it
    recipe = recipe_of(cfg)
    if wants_fit:
        _put(hooks, fit_at, _fit_hook(hooks[fit_at] if fit_at is not None else None,
                                      budget, recipe))
    else:
        _put(hooks, auto_at, _auto_hook(hooks[auto_at] if auto_at is not None else None,
                                        options, recipe))
    cfg.custom_hooks = hooks
    return cfg


register_batch_step(configure_batch_size_search)
