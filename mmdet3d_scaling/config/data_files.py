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
- each ``.bin`` file in the point-cloud folder (``data_prefix.pts``), by size alone (one
  directory scan, a ``stat`` a file, no read): empty, not whole float32 values, not
  whole ``load_dim`` points.

:func:`check_data_files` reports the first few bad point files and the count, each
with the fix, as :class:`BadDataFileError`. Remote paths (``backend_args`` or a URL)
and datasets without a ``LoadPointsFromFile`` step are not checked for point files.
"""
import inspect
import os
import os.path as osp
from typing import Iterable, List, Optional, Sequence, Tuple

from mmengine.config import Config

from ..datasets.point_files import size_fix, size_problem
from .data_config import OPT_OUT, leaf_datasets
from ..datasets.synthetic.target import (MARKERS, incomplete_run, regenerate_command,
                                        synthetic_kind)

__all__ = ['BadDataFileError', 'check_complete_synthetic', 'check_data_files',
           'info_structure_problem']

#: bad point files listed by name in the error (the count says how many more)
SHOWN = 5
_LOAD_POINTS = 'LoadPointsFromFile'
UPDATE_INFOS = 'tools/dataset_converters/update_infos_to_v2.py'


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


def info_structure_problem(obj: object) -> Optional[str]:
    """Why a loaded info file is not an mmdet3d 1.x info file; None when it is."""
    if isinstance(obj, dict) and 'data_list' in obj and 'metainfo' in obj:
        if isinstance(obj['data_list'], list):
            return None
        return f'its data_list is a {type(obj["data_list"]).__name__}, not a list'
    if isinstance(obj, list) or (isinstance(obj, dict) and 'infos' in obj):
        shape = ('a bare list' if isinstance(obj, list) else
                 f'a dict with keys {sorted(map(str, obj))}')
        return (f'is {shape}: the info format of mmdet3d before 1.0, which mmdet3d 1.x '
                'cannot read')
    keys = f' with keys {sorted(map(str, obj))}' if isinstance(obj, dict) else ''
    return (f'is a {type(obj).__name__}{keys}, not an mmdet3d 1.x info file (a dict with '
            "'data_list' and 'metainfo')")


def _update_hint(path: str, dataset_type: str) -> str:
    name = dataset_type.replace('Dataset', '').lower() or 'kitti'
    folder = osp.dirname(path) or '.'
    return (f"convert it with mmdet3d's `python {UPDATE_INFOS} --dataset {name} "
            f'--pkl-path {path} --out-dir {osp.join(folder, "v2")}` (in an mmdet3d '
            'checkout; pip installs it under mmdet3d/.mim/) and point ann_file at {osp.join(folder, "v2", osp.basename(path))}'
            ", or create the infos again with mmdet3d 1.x's tools/create_data.py")


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


def _bad_points(folder: str, load_dim: int) -> Tuple[int, List[Tuple[str, str]]]:
    """(files seen, ``(path, problem)`` of each ``.bin`` file in ``folder`` that can't
    hold ``load_dim``-float32 points): one directory scan, a ``stat`` a file."""
    seen, bad = 0, []
    with os.scandir(folder) as it:
        for entry in sorted(it, key=lambda e: e.name):
            if not entry.name.endswith('.bin') or not entry.is_file():
                continue
            seen += 1
            problem = size_problem(entry.stat().st_size, load_dim)
            if problem:
                bad.append((entry.path, problem))
    return seen, bad


def _check_dataset(ds: dict, where: str, scanned: set) -> List[str]:
    dtype = str(ds.get('type', 'dataset'))
    ann_file = ds.get('ann_file')
    problems = []
    if ann_file and not _remote(ann_file, ds):
        path = _resolve(ds.get('data_root') or '', ann_file)
        problem = _structure_problem(path) if osp.isfile(path) else None
        if problem:  # (a missing file is the missing-path check's)
            fix = (_update_hint(path, dtype) if 'before 1.0' in problem else
                   "create it with mmdet3d 1.x's tools/create_data.py")
            problems.append(f'{where} ({dtype}): info file ann_file={path!r} {problem}; '
                            f'{fix}.')
    load_dim = _load_dim(ds)
    folder = _points_folder(ds)
    if (load_dim is None or not (ds.get('modality') or {}).get('use_lidar', True)
            or _remote(folder, ds) or not osp.isdir(folder) or (folder, load_dim) in scanned):
        return problems
    scanned.add((folder, load_dim))
    seen, bad = _bad_points(folder, load_dim)
    if not bad:
        return problems
    lines = ''.join(f'\n      {p} {why}' for p, why in bad[:SHOWN])
    more = f'\n      ... and {len(bad) - SHOWN} more' if len(bad) > SHOWN else ''
    problems.append(
        f'{where} ({dtype}): {len(bad)} of {seen} point files in {folder} cannot be loaded '
        f'with load_dim={load_dim} (each must be a non-zero multiple of {4 * load_dim} '
        f'bytes):{lines}{more}\n    {size_fix(load_dim)}{_synthetic_hint(ds)}.')
    return problems


def _synthetic_hint(ds: dict) -> str:
    root = (ds.get('data_root') or '').rstrip('/')
    kind = synthetic_kind(root) if root else None
    if kind is None:
        return ''
    return f'; {root} is synthetic data: write it again with `{regenerate_command(root, kind)}`'


def check_data_files(cfg: Config, loaders: Sequence[str]) -> None:
    """Raise :class:`BadDataFileError` naming every unusable info file and the bad point
    files (first :data:`SHOWN` and the count) of the ``loaders``' datasets."""
    problems: List[str] = []
    scanned: set = set()  # (folder, load_dim) already checked: val and test share one
    for ds, where in _loader_datasets(cfg, loaders):
        problems += _check_dataset(ds, where, scanned)
    _raise(problems)
