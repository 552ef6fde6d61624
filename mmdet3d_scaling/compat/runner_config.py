"""mmengine 0.10.x: let the plugin see the whole config before the Runner is built.

``Runner.from_cfg`` picks the keys it knows and silently drops the rest, so mmcv 1.x
keys (``optimizer_config``, ``fp16``) and this plugin's own (``scaling``, ...) would be
ignored. mmdet3d's stock ``tools/train.py`` builds runners through ``Runner.from_cfg``
(or ``RUNNERS.build``, which calls it), so wrapping that one classmethod makes a config
with ``custom_imports=['mmdet3d_scaling']`` behave the same under the stock tools and
ours. The wrapper runs :func:`mmdet3d_scaling.engine.prepare_config` on a copy of the
config; configs without plugin keys come out unchanged apart from CPU/launcher fixes.
"""
import copy

UPSTREAM = 'mmengine 0.10.x'


def apply() -> bool:
    from mmengine.runner import Runner

    original = Runner.__dict__['from_cfg'].__func__
    if getattr(original, '_mmdet3d_scaling_wrapped', False):
        return False

    def from_cfg(cls, cfg):
        from mmdet3d_scaling.engine.config_preparation import prepare_config
        return original(cls, prepare_config(copy.deepcopy(cfg)))

    from_cfg._mmdet3d_scaling_wrapped = True
    from_cfg.__doc__ = original.__doc__
    Runner.from_cfg = classmethod(from_cfg)
    return True
