"""Turn a config that uses the plugin's keys into what mmengine's Runner understands.

:class:`mmdet3d_scaling.engine.ScalingRunner` calls :func:`prepare_config` once, on a
copy of the config, before the Runner is built. Every step is a pure ``cfg -> cfg``
function of this package and idempotent: preparing a prepared config changes nothing.
The data preflight is not a step here: it runs when the runner knows which loaders a
command uses (:mod:`mmdet3d_scaling.config.preflight`).
"""
from typing import List

from mmengine.config import Config

from ..compat.checkpoint import trust_checkpoints
from ..engine.launcher import resolve_launcher, world_size
from .auto_batch_size import configure_auto_batch_size
from .devices import configure_devices
from .distributed import configure_distributed
from .legacy_keys import translate_amp_config, translate_optimizer_config
from .matmul_precision import configure_matmul_precision
from .preemption import use_resumable_sampler
from .scaling_recipe import apply_scaling_recipe

#: top-level keys that only this plugin reads (mmengine ignores them)
PLUGIN_KEYS = ('scaling', 'optimizer_config', 'fp16', 'amp', 'distributed',
               'auto_batch_size', 'patches', 'trusted_checkpoints',
               'float32_matmul_precision', 'preflight', 'resume_strict')
_OUR_WRAPPER = 'ScalingDistributedDataParallel'


def _our_types(entries) -> List[str]:
    from ..registry import our_type_names
    ours = our_type_names()
    names = [e.get('type') for e in entries or [] if isinstance(e, dict)]
    return [n for n in names if isinstance(n, str) and n.split('.')[-1] in ours]


def plugin_keys(cfg: Config) -> List[str]:
    """The plugin features a config uses: its keys, and our hooks / wrapper by type."""
    found = [key for key in PLUGIN_KEYS if cfg.get(key) is not None]
    runner_type = cfg.get('runner_type')
    if isinstance(runner_type, str) and runner_type.split('.')[-1] == 'ScalingRunner':
        found.insert(0, 'runner_type=ScalingRunner')
    hooks = _our_types(cfg.get('custom_hooks'))
    hooks += _our_types((cfg.get('default_hooks') or {}).values())
    found += [f'hook {name}' for name in hooks]
    wrapper = (cfg.get('model_wrapper_cfg') or {}).get('type')
    if isinstance(wrapper, str) and wrapper.split('.')[-1] == _OUR_WRAPPER:
        found.append(f'model_wrapper_cfg.type={wrapper}')
    return found


def apply_trusted_checkpoints(cfg: Config) -> None:
    """``trusted_checkpoints = [...]`` in a config: allow full unpickling of those files."""
    paths = cfg.get('trusted_checkpoints') or []
    if isinstance(paths, str):
        paths = [paths]
    trust_checkpoints(paths)


def prepare_config(cfg: Config) -> Config:
    """Apply the plugin's config steps in order and return ``cfg`` (modified in place)."""
    cfg.launcher = resolve_launcher(cfg.get('launcher', 'none'))
    apply_trusted_checkpoints(cfg)
    configure_devices(cfg)
    configure_matmul_precision(cfg)
    configure_auto_batch_size(cfg)  # before the recipe: turns 'auto' into the hook
    translate_optimizer_config(cfg)  # mmcv 1.x optimizer_config, accumulation hook
    translate_amp_config(cfg)  # mmcv 1.x fp16, plugin amp
    apply_scaling_recipe(cfg, world_size(cfg.launcher))  # after accumulation translation
    configure_distributed(cfg)  # after configure_devices: builds on its wrapper config
    use_resumable_sampler(cfg)  # PreemptionHook: a resumed epoch skips trained samples
    return cfg
