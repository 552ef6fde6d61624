"""mmengine 0.10.x: configs that use the plugin's keys reach ``ScalingRunner``.

``Runner.from_cfg`` picks the keys it knows and silently drops the rest, so mmcv 1.x
keys (``optimizer_config``, ``fp16``) and this plugin's own (``scaling``, ...) would be
ignored under mmdet3d's stock ``tools/train.py``, which calls ``Runner.from_cfg`` when a
config has no ``runner_type``. The hand-off looks at the config: with plugin keys
(:func:`mmdet3d_scaling.config.plugin_keys`) it builds a ``ScalingRunner`` and says which
keys it found; without, it calls upstream's ``from_cfg`` untouched, so a stock config
gets exactly upstream's runner (wrapper, timeout, hooks). Subclasses (``ScalingRunner``
included) always get upstream's method.
"""
from typing import Any, List

from mmengine.logging import print_log
from mmengine.runner import Runner

from ..patches.patching import Change, Patch, declare

UPSTREAM = 'mmengine>=0.10,<0.11'
_upstream_from_cfg = Runner.__dict__['from_cfg'].__func__


def from_cfg(cls, cfg) -> Any:
    if cls is not Runner:
        return _upstream_from_cfg(cls, cfg)
    from ..config import plugin_keys
    found = plugin_keys(cfg)
    if not found:
        print_log('mmdet3d_scaling: no plugin keys in this config; mmengine builds it '
                  'unchanged.', logger='current')
        return _upstream_from_cfg(cls, cfg)
    from .runner import ScalingRunner
    from .startup_log import startup_level
    print_log(f"mmdet3d_scaling: the config uses {', '.join(found)}: built by "
              "ScalingRunner (runner_type='ScalingRunner' selects it explicitly).",
              logger='current', level=startup_level())
    return ScalingRunner.from_cfg(cfg)


from_cfg.__doc__ = _upstream_from_cfg.__doc__


def _changes() -> List[Change]:
    return [Change(Runner, 'from_cfg', classmethod(from_cfg))]


PATCH = declare(Patch(
    name='runner_handoff', kind='fixes', targets=('mmengine.runner.Runner.from_cfg',),
    upstream=UPSTREAM, changes=_changes,
    why='Runner.from_cfg silently drops unknown keys (optimizer_config, fp16, scaling): '
        'configs that use them are built by ScalingRunner; others exactly as upstream'))
