"""``mmdet3d_scaling::<config>`` paths, as for OpenMMLab's own packages.

mmengine 0.10 resolves ``pkg::path`` (in ``_base_`` lists and ``mmengine.hub.get_config``)
through the installed package's ``.mim/configs`` folder, which ``setup.py`` ships, but
only for the packages in its fixed ``MODULE2PACKAGE`` table: any other name stops with
``AssertionError: mmengine does not support to load mmdet3d_scaling config``.

Two wrappers, each passing every other path to mmengine unchanged:

- ``Config._get_cfg_path`` (``_base_`` entries): ``mmdet3d_scaling::<path>`` is the file
  ``.mim/configs/<path>`` of the imported package, with scope ``mmdet3d``. The configs
  there are mmdet3d-scope configs (their types are mmdet3d's, or the plugin's
  registered under mmdet3d's plain names), so they build exactly as from a file path;
  the package's own name as scope would send the types to registries that do not hold
  them. Found from the imported module, so any install (wheel, editable) works.
- ``_get_package_and_cfg_path`` as ``mmengine.hub`` bound it (``get_config``):
  ``mmdet3d_scaling::<path>`` maps to the distribution ``mmdet3d-scaling``; mmengine then
  reads its ``.mim/model-index.yml`` (empty) and falls back to ``.mim/configs/<path>``.

``MODULE2PACKAGE`` itself is left alone: mmengine's registries read it to decide whether
to import ``<scope>.utils``, and an entry there would make lookups in the plugin's scoped
registries warn that the package is not installed.

It takes effect once ``mmdet3d_scaling`` is imported, i.e. before the config is parsed:
``tools/train.py`` / ``tools/test.py`` of this package (and ``mim train mmdet3d_scaling``,
which runs them) and ``mmengine.hub.get_config`` after the import. mmdet3d's own
``tools/train.py`` parses the config before its ``custom_imports``, so there a config
needs a file path, not ``mmdet3d_scaling::``.
"""
import os.path as osp
from typing import Callable, List, Optional, Tuple

from mmengine.config import Config
from mmengine.hub import hub as hub_module

from ..patching import Change, Patch, declare

UPSTREAM = 'mmengine>=0.10,<0.11'
SCOPE = 'mmdet3d_scaling'
DISTRIBUTION = 'mmdet3d-scaling'
CONFIG_SCOPE = 'mmdet3d'  # the registry scope our configs are written for
MIM_CONFIGS = osp.join(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))), '.mim',
                       'configs')


def _relative(cfg_path: str) -> str:
    """``mmdet3d_scaling::demo/x.py`` -> ``demo/x.py``.

    Raises:
        ValueError: the path after ``::`` is empty or has another ``::``.
    """
    relative = cfg_path.partition('::')[2]
    if not relative or '::' in relative:
        raise ValueError(
            f'bad config path {cfg_path!r}: write {SCOPE}::<folder>/<file>.py, e.g. '
            f'{SCOPE}::demo/pointpillars_synthetic_kitti_cpu.py (a path under the '
            "repository's configs/).")
    return relative


def config_file(cfg_path: str) -> str:
    """The file behind ``mmdet3d_scaling::<path>`` in the imported package.

    Raises:
        FileNotFoundError: no such config, or a package without ``.mim/configs`` (a
            source tree never installed: ``pip install -e .`` creates it).
    """
    if not osp.isdir(MIM_CONFIGS):
        raise FileNotFoundError(
            f'{cfg_path}: {MIM_CONFIGS} is missing; install the package '
            '(`pip install .`, or `pip install -e .` in a checkout), which ships it.')
    path = osp.join(MIM_CONFIGS, _relative(cfg_path))
    if not osp.isfile(path):
        raise FileNotFoundError(
            f'{cfg_path}: no file {path}; the configs of mmdet3d_scaling are the '
            f'.py files under {MIM_CONFIGS}.')
    return path


def _ours(cfg_path: str) -> bool:
    return cfg_path.partition('::')[0] == SCOPE and '::' in cfg_path


def _wrap_get_cfg_path(upstream: Callable) -> Callable:
    def _get_cfg_path(cfg_path: str, filename: str) -> Tuple[str, Optional[str]]:
        if _ours(cfg_path):
            return config_file(cfg_path), CONFIG_SCOPE
        return upstream(cfg_path, filename)

    _get_cfg_path.__doc__ = upstream.__doc__
    return _get_cfg_path


def _wrap_package_and_cfg_path(upstream: Callable) -> Callable:
    def _get_package_and_cfg_path(cfg_path: str) -> Tuple[str, str]:
        if _ours(cfg_path):
            return DISTRIBUTION, _relative(cfg_path)
        return upstream(cfg_path)

    _get_package_and_cfg_path.__doc__ = upstream.__doc__
    return _get_package_and_cfg_path


def _changes() -> List[Change]:
    return [
        Change(Config, '_get_cfg_path',
               staticmethod(_wrap_get_cfg_path(Config._get_cfg_path))),
        Change(hub_module, '_get_package_and_cfg_path',
               _wrap_package_and_cfg_path(hub_module._get_package_and_cfg_path)),
    ]


PATCH = declare(Patch(
    name='config_scope', kind='fixes',
    targets=('mmengine.config.Config._get_cfg_path',
             'mmengine.hub.hub._get_package_and_cfg_path'),
    upstream=UPSTREAM, changes=_changes,
    why="mmdet3d_scaling::<config> stops with an AssertionError (mmengine's fixed "
        'package table): resolved to the installed .mim/configs like mmdet3d::'))
