"""mmengine 0.10.x: configs that use the plugin's keys reach ``ScalingRunner``.

``Runner.from_cfg`` picks the keys it knows and silently drops the rest, so mmcv 1.x
keys (``optimizer_config``, ``fp16``) and this plugin's own (``scaling``, ...) would be
ignored under mmdet3d's stock ``tools/train.py``, which calls ``Runner.from_cfg`` when a
config has no ``runner_type``. The hand-off asks the engine (:data:`plugin_runner`, which
``mmdet3d_scaling.engine.runner`` sets at import: it reads the plugin keys and builds the
``ScalingRunner``) and, when the config has no plugin keys, calls upstream's
``from_cfg`` untouched, so a stock config gets exactly upstream's runner (wrapper,
timeout, hooks). Subclasses (``ScalingRunner`` included) always get upstream's method.
The builder is handed in rather than imported: ``patches`` sits below ``config`` and
``engine`` (docs/architecture.md).
"""
from typing import Any, Callable, List, Optional

from mmengine.logging import print_log
from mmengine.runner import Runner

from ..patching import Change, Patch, declare

UPSTREAM = 'mmengine>=0.10,<0.11'
_upstream_from_cfg = Runner.__dict__['from_cfg'].__func__
#: cfg -> the ScalingRunner for a config with plugin keys, else None (set by the engine)
plugin_runner: Optional[Callable[[Any], Optional[Runner]]] = None


def from_cfg(cls, cfg) -> Any:
    if cls is not Runner or plugin_runner is None:
        return _upstream_from_cfg(cls, cfg)
    runner = plugin_runner(cfg)
    if runner is None:
        print_log('mmdet3d_scaling: no plugin keys in this config; mmengine builds it '
                  'unchanged.', logger='current')
        return _upstream_from_cfg(cls, cfg)
    return runner


from_cfg.__doc__ = _upstream_from_cfg.__doc__


def _changes() -> List[Change]:
    return [Change(Runner, 'from_cfg', classmethod(from_cfg))]


PATCH = declare(Patch(
    name='runner_handoff', kind='fixes', targets=('mmengine.runner.Runner.from_cfg',),
    upstream=UPSTREAM, changes=_changes,
    why='Runner.from_cfg silently drops unknown keys (optimizer_config, fp16, scaling): '
        'configs that use them are built by ScalingRunner; others exactly as upstream'))
