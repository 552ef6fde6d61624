"""Check the data files a run will read before it starts: every bad file named at once.

:func:`mmdet3d_scaling.config.preflight.check_data_paths` finds missing paths; this
module looks at the files that exist, for the dataloaders a command reads:

- a synthetic dataset whose generator run did not finish (its marker says
  ``"complete": false``: killed during ``--overwrite``, its infos, labels and point files
  may come from different runs) -> :func:`check_complete_synthetic`;
- each info file (``ann_file``): of mmdet3d 1.x's structure (a dict with ``data_list``
  and ``metainfo``), told from the pickle's first opcodes (a large file is not read in
  full); the pre-1.x structures (a dict with ``infos``, or a bare list) are named with
  mmdet3d's ``update_infos_to_v2.py`` command;
- each point file (``lidar_points.lidar_path`` under ``data_prefix.pts``) and, when
  the pipeline loads images and the modality uses the camera, each image
  (``images.<cam>.img_path`` under ``data_prefix.<cam>`` or ``data_prefix.img``) that
  the info file references, as mmdet3d's ``Det3DDataset`` joins them: missing, and for
  point files by size (one ``stat`` a file, no read): empty, not whole float32 values,
  not whole ``load_dim`` points. Files that no info file references are not judged.

The info file is loaded for this (the dataset loads it once more when it is built:
a pickle load, no file of the data itself is read). :func:`check_data_files` reports
the count and the first few files of each kind, with the fix, as
:class:`BadDataFileError`. Remote paths (``backend_args`` or a URL) are not checked;
point files only for datasets with a ``LoadPointsFromFile`` step, sweeps
(``LoadPointsFromMultiSweeps``) not at all.
"""
import inspect
import os
import os.path as osp
from typing import Iterable, List, Optional, Sequence, Tuple

from mmengine.config import Config

from ..datasets.point_files import size_fix, size_problem
from ..datasets.info_format import info_structure_problem, update_hint
from .data_config import OPT_OUT, leaf_datasets
from ..datasets.synthetic.target import (MARKERS, incomplete_run, regenerate_command,
                                        synthetic_kind)

__all__ = ['BadDataFileError', 'check_complete_synthetic', 'check_data_files',
           'info_structure_problem']

#: bad point files listed by name in the error (the count says how many more)
SHOWN = 5
_LOAD_POINTS = 'LoadPointsFromFile'


class BadDataFileError(ValueError):
    """A data file of the config exists but cannot be used as it is."""


def _loader_datasets(cfg: Config, loaders: Sequence[str]) -> Iterable[Tuple[dict, str]]:
    """``(leaf dataset cfg, key path)`` of the loaders, each dataset once."""
    seen = set()
    for key in loaders:
        loader = cfg.get(key)
        if not isinstance(loader, dict):
            continue
        for ds, where in leaf_datasets(loader.get('dataset'), f'{key}.dataset'):
            ident = repr((ds.get('data_root'), ds.get('ann_file'), ds.get('data_prefix')))
            if ident not in seen:
                seen.add(ident)
                yield ds, where


def _remote(path: str, ds: dict) -> bool:
    return '://' in str(path) or ds.get('backend_args') is not None


def _resolve(data_root: str, path: str) -> str:
    return path if osp.isabs(path) or not data_root else osp.join(data_root, path)


def _raise(problems: List[str]) -> None:
    if problems:
        raise BadDataFileError('bad data files:\n  - ' + '\n  - '.join(problems) + '\n'
                               + OPT_OUT)


def check_complete_synthetic(cfg: Config, loaders: Sequence[str]) -> None:
    """Refuse a ``data_root`` where a synthetic-data run started and did not finish."""
    problems, roots = [], set()
    for ds, where in _loader_datasets(cfg, loaders):
        root = (ds.get('data_root') or '').rstrip('/')
        if not root or root in roots or _remote(root, ds):
            continue
        roots.add(root)
        kind = incomplete_run(root)
        if kind is not None:
            problems.append(
                f'{where}: data_root {root!r} holds an unfinished synthetic {kind} dataset: '
                f'its marker {MARKERS[kind]} says the generator run that last wrote it did '
                'not complete (killed or failed), so its info, label and point files may '
                'come from different runs. Write it again with '
                f'`{regenerate_command(root, kind)}`.')
    _raise(problems)


def _load_info(path: str) -> object:
    """The info file's content; a parse error becomes the named ``info_files`` error."""
    from mmengine.fileio import load
    from ..patches.fixes.info_files import corrupt_info_error
    try:
        return load(path)
    except OSError:
        raise
    except Exception as err:
        raise corrupt_info_error(path, err) from err


_STRINGS = ('SHORT_BINUNICODE', 'BINUNICODE', 'BINUNICODE8', 'UNICODE')
_BOOKKEEPING = ('PROTO', 'FRAME', 'MEMOIZE', 'BINPUT', 'LONG_BINPUT', 'PUT', 'MARK')


def _pickle_head(path: str) -> Tuple[str, Optional[str]]:
    """``('dict', first key)``, ``('list', None)`` or ``('other', None)``: the top-level
    object of a pickle from its first opcodes (a pickler writes the outer container
    first, then its first key), without reading the rest of a large file."""
    import pickletools
    kind = None
    try:
        with open(path, 'rb') as f:
            for op, arg, _ in pickletools.genops(f):
                if op.name in _BOOKKEEPING:
                    continue
                if kind is None and op.name == 'EMPTY_DICT':
                    kind = 'dict'
                    continue
                if kind is None:
                    return ('list' if op.name == 'EMPTY_LIST' else 'other'), None
                return kind, (arg if op.name in _STRINGS else None)
    except Exception:  # cut or not a pickle: left to the full load and its named error
        pass
    return 'other', None


def _structure_problem(path: str) -> Optional[str]:
    """:func:`info_structure_problem` of the info file at ``path``, read in full only
    when its first opcodes do not settle it (a v2 file starts with ``metainfo`` or
    ``data_list``; a pre-1.0 one with ``infos``/``metadata`` or is a list)."""
    if path.endswith('.pkl'):
        kind, key = _pickle_head(path)
        if kind == 'dict' and key in ('metainfo', 'data_list'):
            return None  # mmengine checks the rest as it loads
        if kind == 'list':
            return info_structure_problem([])
    return info_structure_problem(_load_info(path))


def _load_dim(ds: dict) -> Optional[int]:
    """``load_dim`` of the dataset's LoadPointsFromFile step (its default when unset)."""
    for step in ds.get('pipeline') or []:
        if isinstance(step, dict) and str(step.get('type', '')).endswith(_LOAD_POINTS):
            if step.get('backend_args') is not None:
                return None
            return int(step.get('load_dim', _default(_LOAD_POINTS, 'load_dim', 6)))
    return None


def _default(type_name: str, arg: str, fallback):
    """The default of ``arg`` in mmdet3d's registered class ``type_name``."""
    from mmdet3d.registry import DATASETS, TRANSFORMS
    for registry in (TRANSFORMS, DATASETS):
        cls = registry.get(type_name)
        if cls is not None:
            param = inspect.signature(cls.__init__).parameters.get(arg)
            if param is not None and param.default is not inspect.Parameter.empty:
                return param.default
    return fallback


def _points_folder(ds: dict) -> str:
    prefix = ds.get('data_prefix')
    if prefix is None:
        prefix = _default(str(ds.get('type')), 'data_prefix', {}) or {}
    return _resolve(ds.get('data_root') or '', prefix.get('pts', ''))


def _loads_images(ds: dict) -> bool:
    """Whether the pipeline loads the images the infos reference (and the modality
    uses the camera, as ``Det3DDataset.parse_data_info`` requires to join their paths)."""
    if not (ds.get('modality') or {}).get('use_camera', False):
        return False
    return any(isinstance(step, dict) and 'Load' in str(step.get('type', ''))
               and 'Image' in str(step.get('type', '')) for step in ds.get('pipeline') or [])


def _prefix(ds: dict) -> dict:
    prefix = ds.get('data_prefix')
    if prefix is None:
        prefix = _default(str(ds.get('type')), 'data_prefix', {}) or {}
    return dict(prefix)


def _referenced(ds: dict, infos: dict, points: bool, images: bool
                ) -> Tuple[List[str], List[str]]:
    """(point files, images) the info file's frames name, joined as mmdet3d does:
    ``data_root / data_prefix[key] / path``."""
    root, prefix = ds.get('data_root') or '', _prefix(ds)
    pts_folder = _resolve(root, prefix.get('pts', ''))
    pts, imgs = [], []
    for info in infos.get('data_list') or []:
        if not isinstance(info, dict):
            continue
        lidar = (info.get('lidar_points') or {}).get('lidar_path') if points else None
        if lidar:
            pts.append(osp.join(pts_folder, lidar))
        for cam, image in ((info.get('images') or {}).items() if images else ()):
            if isinstance(image, dict) and image.get('img_path'):
                cam_prefix = prefix.get(cam, prefix.get('img', ''))
                imgs.append(osp.join(_resolve(root, cam_prefix), image['img_path']))
    return pts, imgs


def _stat_size(path: str) -> Optional[int]:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return None


def _listed(paths: Sequence[str], what: str = '') -> str:
    shown = ''.join(f'\n      {p}{what}' for p in paths[:SHOWN])
    return shown + (f'\n      ... and {len(paths) - SHOWN} more' if len(paths) > SHOWN else '')


def _bad_points(paths: Sequence[str], load_dim: int
                ) -> Tuple[List[str], List[Tuple[str, str]]]:
    """(missing paths, ``(path, problem)`` of those that can't hold ``load_dim``-float32
    points): a ``stat`` a file, no read."""
    missing, bad = [], []
    for path in paths:
        size = _stat_size(path)
        if size is None:
            missing.append(path)
            continue
        problem = size_problem(size, load_dim)
        if problem:
            bad.append((path, problem))
    return missing, bad


def _missing_fix(ds: dict) -> str:
    return ('copy the missing files again (a deleted file or an interrupted copy), or '
            "create the info file again for the files present (mmdet3d's "
            f'tools/create_data.py){_synthetic_hint(ds)}')


def _check_referenced(ds: dict, where: str, path: str, checked: set) -> List[str]:
    """Problems of the point files and images the info file at ``path`` references."""
    dtype = str(ds.get('type', 'dataset'))
    load_dim = _load_dim(ds)
    points = load_dim is not None and (ds.get('modality') or {}).get('use_lidar', True) \
        and not _remote(_points_folder(ds), ds)
    images = _loads_images(ds) and not _remote(ds.get('data_root') or '', ds)
    key = (path, repr(_prefix(ds)), ds.get('data_root'), load_dim, points, images)
    if not (points or images) or key in checked:
        return []
    checked.add(key)
    infos = _load_info(path)
    pts, imgs = _referenced(ds, infos if isinstance(infos, dict) else {}, points, images)
    problems, head = [], f'{where} ({dtype})'
    missing, bad = _bad_points(pts, load_dim) if points else ([], [])
    if missing:
        problems.append(
            f'{head}: {len(missing)} of {len(pts)} point files that {path} references '
            f'are missing:{_listed(missing)}\n    {_missing_fix(ds)}.')
    if bad:
        lines = ''.join(f'\n      {p} {why}' for p, why in bad[:SHOWN])
        more = f'\n      ... and {len(bad) - SHOWN} more' if len(bad) > SHOWN else ''
        problems.append(
            f'{head}: {len(bad)} of {len(pts)} point files in {_points_folder(ds)} that '
            f'{path} references cannot be loaded with load_dim={load_dim} (each must be a '
            f'non-zero multiple of {4 * load_dim} bytes):{lines}{more}\n    '
            f'{size_fix(load_dim)}{_synthetic_hint(ds)}.')
    gone = [p for p in imgs if not _stat_size(p)]
    if gone:
        problems.append(
            f'{head}: {len(gone)} of {len(imgs)} images that {path} references are missing '
            f'or empty:{_listed(gone)}\n    {_missing_fix(ds)}.')
    return problems


def _check_dataset(ds: dict, where: str, checked: set) -> List[str]:
    dtype = str(ds.get('type', 'dataset'))
    ann_file = ds.get('ann_file')
    if not ann_file or _remote(ann_file, ds):
        return []
    path = _resolve(ds.get('data_root') or '', ann_file)
    if not osp.isfile(path):
        return []  # the missing-path check's
    problem = _structure_problem(path)
    if problem:
        fix = (update_hint(path, dtype) if 'before 1.0' in problem else
               "create it with mmdet3d 1.x's tools/create_data.py")
        return [f'{where} ({dtype}): info file ann_file={path!r} {problem}; {fix}.']
    return _check_referenced(ds, where, path, checked)


def _synthetic_hint(ds: dict) -> str:
    root = (ds.get('data_root') or '').rstrip('/')
    kind = synthetic_kind(root) if root else None
    if kind is None:
        return ''
    return f'; {root} is synthetic data: write it again with `{regenerate_command(root, kind)}`'


def check_data_files(cfg: Config, loaders: Sequence[str]) -> None:
    """Raise :class:`BadDataFileError` naming every unusable info file and the missing
    or bad point files and images it references (first :data:`SHOWN` and the count) of
    the ``loaders``' datasets."""
    problems: List[str] = []
    checked: set = set()  # info files already checked: val and test often share one
    for ds, where in _loader_datasets(cfg, loaders):
        problems += _check_dataset(ds, where, checked)
    _raise(problems)
