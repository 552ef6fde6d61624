"""mmdet3d-scaling: a plugin for mmdetection3d 1.4 / mmengine 0.10.

``import mmdet3d_scaling`` (or ``custom_imports = dict(imports=['mmdet3d_scaling'])``
in a config) registers the plugin's runner, hooks, models, transforms and DDP wrapper
into mmengine's / mmdet3d's registries and applies the ``fixes`` patch set (plus the
``cpu`` set where torch has no CUDA). Nothing else changes until a config asks:
``runner_type = 'ScalingRunner'`` or a plugin key (``scaling``, ``optimizer_config``,
``fp16``, ``distributed``, ``patches``, ...). See ``docs/patches.md`` for every patch.

The package is layered (``docs/architecture.md``); each layer imports only the layers
below it, which ``tests/test_layers.py`` checks.
"""
from .version import __version__
from . import patches  # noqa: F401  (declares the patches; mmcv ops checked first)
from .patches import patching as _patching

_patching.apply(_patching.default_selection())
_patching.warn_outside_range()  # a fix written for other versions: said, not applied

from . import config, engine  # noqa: E402,F401  (config before engine.runner)
from .engine import runner as _runner  # noqa: E402,F401  (registers ScalingRunner)
from . import batch_size, datasets, hooks, models  # noqa: E402,F401
from .parallel import ScalingDistributedDataParallel  # noqa: E402,F401
from .engine.runner import ScalingRunner  # noqa: E402

__all__ = ['__version__', 'ScalingRunner']
