"""Turn a config that uses the plugin's keys into what mmengine's Runner understands.

:class:`mmdet3d_scaling.engine.ScalingRunner` calls :func:`prepare_config` once, on a
copy of the config, before the Runner is built. Every step is a pure ``cfg -> cfg``
function of this package and idempotent: preparing a prepared config changes nothing.
Nothing here changes process-wide state: what a config asks of the process (TF32,
trusted checkpoints) is in effect during the runner's build and commands only, and
restored after each (``engine/run_settings.py``).
The data preflight is not a step here either: it runs when the runner knows which
loaders a command uses (:mod:`mmdet3d_scaling.config.preflight`).
"""
from typing import Callable, List

from mmengine.config import Config
from mmengine.logging import print_log

from ..parallel.launcher import LAUNCHERS, resolve_launcher, world_size
from ..utils.registry_scope import strip_scope
from .async_logging import configure_async_logging
from .devices import configure_devices
from .distributed import configure_distributed
from .fused_optimizer import check_fused_optimizer
from .legacy_keys import translate_amp_config, translate_optimizer_config
from .matmul_precision import check_matmul_precision
from .scaling_recipe import accumulation_in_force, apply_scaling_recipe, planned
from .preemption import use_resumable_sampler

#: top-level keys that only this plugin reads (mmengine ignores them)
PLUGIN_KEYS = ('scaling', 'optimizer_config', 'fp16', 'amp', 'distributed',
               'auto_batch_size', 'patches', 'trusted_checkpoints',
               'float32_matmul_precision', 'preflight', 'resume_strict', 'async_logging')
_OUR_WRAPPER = 'ScalingDistributedDataParallel'

Step = Callable[[Config], Config]
#: steps that may leave the per-GPU batch to a hook, from feature packages above this
#: layer (``mmdet3d_scaling.batch_size`` registers its step when imported, which
#: ``import mmdet3d_scaling`` does); they run before the scaling recipe, which expects a
#: number or None in ``scaling.per_gpu_batch_size``
BATCH_STEPS: List[Step] = []


def register_batch_step(step: Step) -> Step:
    """Add ``step`` to :data:`BATCH_STEPS` (once) and return it."""
    if step not in BATCH_STEPS:
        BATCH_STEPS.append(step)
    return step


def _our_types(entries) -> List[str]:
    from ..registry import our_type_names
    ours = our_type_names()
    names = [e.get('type') for e in entries or [] if isinstance(e, dict)]
    return [n for n in names if isinstance(n, str) and strip_scope(n) in ours]


def plugin_keys(cfg: Config) -> List[str]:
    """The plugin features a config uses: its keys, and our hooks / wrapper by type."""
    found = [key for key in PLUGIN_KEYS if cfg.get(key) is not None]
    runner_type = cfg.get('runner_type')
    if isinstance(runner_type, str) and strip_scope(runner_type) == 'ScalingRunner':
        found.insert(0, 'runner_type=ScalingRunner')
    hooks = _our_types(cfg.get('custom_hooks'))
    hooks += _our_types((cfg.get('default_hooks') or {}).values())
    found += [f'hook {name}' for name in hooks]
    wrapper = (cfg.get('model_wrapper_cfg') or {}).get('type')
    if isinstance(wrapper, str) and strip_scope(wrapper) == _OUR_WRAPPER:
        found.append(f'model_wrapper_cfg.type={wrapper}')
    return found


def trusted_checkpoint_paths(cfg: Config) -> List[str]:
    """``trusted_checkpoints`` (a path or a list of paths), checked, as a list."""
    paths = cfg.get('trusted_checkpoints') or []
    if isinstance(paths, str):
        paths = [paths]
    if not isinstance(paths, (list, tuple)) or not all(isinstance(p, str) for p in paths):
        raise ValueError(f'trusted_checkpoints must be a path or a list of paths, got '
                         f'{paths!r}')
    return list(paths)


def prepare_config(cfg: Config) -> Config:
    """Apply the plugin's config steps in order and return ``cfg`` (modified in place)."""
    launcher = cfg.get('launcher') or 'none'
    # tools/train.py resolved it already; a config of its own may say 'auto'
    cfg.launcher = launcher if launcher in LAUNCHERS else resolve_launcher(launcher)
    trusted_checkpoint_paths(cfg)
    configure_devices(cfg)
    check_matmul_precision(cfg)
    fused = check_fused_optimizer(cfg)
    if fused:
        print_log(fused, logger='current')
    for step in BATCH_STEPS:  # the batch size search: 'auto' / memory_budget -> hook
        step(cfg)
    world = world_size(cfg.launcher)
    plan = planned(cfg, world)  # worked out once, for the accumulation translation too
    translate_optimizer_config(  # mmcv 1.x optimizer_config, accumulation hook
        cfg, scaling_accumulation=accumulation_in_force(cfg, plan))
    translate_amp_config(cfg)  # mmcv 1.x fp16, plugin amp
    apply_scaling_recipe(cfg, world, plan)  # after accumulation translation
    configure_distributed(cfg)  # after configure_devices: builds on its wrapper config
    use_resumable_sampler(cfg)  # PreemptionHook: a resumed epoch skips trained samples
    configure_async_logging(cfg)  # runtime_info hook + deferred_grad_norm patch
    return cfg
