"""mmdet3d-scaling: a plugin for mmdetection3d 1.4 / mmengine 0.10.

``import mmdet3d_scaling`` (or ``custom_imports = dict(imports=['mmdet3d_scaling'])`` in
a config) applies the compat shims and registers every hook, model, transform and
dataset of this package into mmdet3d's registries (scope ``mmdet3d``).
"""
from .version import __version__
from . import compat  # noqa: F401  (first: the shims must be in place for the rest)
from . import datasets, engine, hooks, models  # noqa: F401

__all__ = ['__version__']
