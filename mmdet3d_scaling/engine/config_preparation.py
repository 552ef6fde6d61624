"""Turn a user's config into what mmengine's Runner understands.

Called on a copy of the config by ``Runner.from_cfg`` (see
:mod:`mmdet3d_scaling.compat.runner_config`), so the stock mmdet3d tools and ours
behave the same. Every step is idempotent: preparing a prepared config changes nothing.
"""
from mmengine.config import Config

from ..compat.checkpoint import trust_checkpoints
from ..datasets.preflight import check_data_paths
from .launcher import resolve_launcher, world_size
from .legacy_config import translate_amp_config, translate_optimizer_config
from .matmul_precision import configure_matmul_precision
from .parallel import configure_devices, configure_distributed
from .auto_batch_size import configure_auto_batch_size
from .scaling_recipe import apply_scaling_recipe


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
    check_data_paths(cfg)  # last: earlier steps may rewrite data paths
    return cfg
