"""Check a config's data paths before the Runner starts, and say how to fix them.

Without this, a missing dataset fails late (when the first dataloader is built,
possibly after minutes of model setup) with a bare ``FileNotFoundError`` from deep
inside mmengine. :func:`check_data_paths` runs from
:class:`mmdet3d_scaling.engine.ScalingRunner` at the start of ``train()`` / ``val()`` /
``test()`` and reports, for the dataloaders that command reads (through RepeatDataset,
ConcatDataset, CBGSDataset and other wrappers) and their evaluators:

- a missing ``data_root``;
- a missing or empty (0 bytes) info file (``ann_file``) or ObjectSample database
  (``db_sampler.info_path``);
- a missing point-cloud folder (``data_prefix.pts``);
- for ``NuScenesMetric``, missing devkit tables under ``data_root/<version>/``;

each with the command that creates it; then, in :mod:`.data_files`, an unfinished
synthetic dataset, info files of the wrong structure and point files of a bad size
(:class:`~.data_files.BadDataFileError`). Synthetic data is suggested into ``data_root``
only when that folder is absent, empty or written by the generator (its
``.synthetic_<format>`` marker): a folder with other files may be a real dataset, so
the error suggests mmdet3d's converter for it, and for synthetic data a separate folder
plus the ``--cfg-options`` that point the config there. Paths on remote storage
(``backend_args`` set, or a URL) are not checked. A config can skip the check with
``preflight = dict(check_data=False)`` (e.g. a test that never loads data); the error
says so.
"""
import os
import os.path as osp
from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple

from mmengine.config import Config

from ..datasets.synthetic.target import MARKERS, entries, synthetic_kind
from .data_config import OPT_OUT, leaf_datasets
from .data_files import check_complete_synthetic, check_data_files

__all__ = ['MissingDataError', 'check_data_paths', 'leaf_datasets', 'synthetic_overrides']

#: dataset type -> subcommand of tools/create_synthetic_data.py that writes its format
SYNTHETIC_SUBCOMMANDS = {'KittiDataset': 'kitti', 'NuScenesDataset': 'nuscenes'}
#: the tables the nuScenes devkit (NuScenes(...), run by NuScenesMetric) opens
NUSCENES_TABLES = ('category', 'attribute', 'visibility', 'instance', 'sensor',
                   'calibrated_sensor', 'ego_pose', 'log', 'scene', 'sample', 'sample_data',
                   'sample_annotation', 'map')
_LOADERS = ('train_dataloader', 'val_dataloader', 'test_dataloader')
_EVALUATORS = ('val_evaluator', 'test_evaluator')


class MissingDataError(FileNotFoundError):
    """A data path named in the config does not exist (or is an empty file)."""


def _is_remote(path: str, cfg: dict) -> bool:
    return '://' in str(path) or cfg.get('backend_args') is not None


def _norm(folder: str) -> str:
    return folder.rstrip('/') or '.'


def _writable_by(folder: str, sub: str) -> bool:
    """Whether the ``sub`` generator may be pointed at ``folder``: absent, empty or its own."""
    return not entries(folder) or synthetic_kind(folder) == sub


def _create_hint(dataset_type: str, data_root: str) -> str:
    """How to create the files of a ``dataset_type`` dataset under ``data_root``."""
    sub = SYNTHETIC_SUBCOMMANDS.get(dataset_type)
    root = _norm(data_root)
    if sub is None:
        return (f"prepare {dataset_type} with mmdet3d's `tools/create_data.py` "
                '(see the mmdet3d 1.4 dataset docs)')
    convert = (f"convert the real dataset with mmdet3d's `python tools/create_data.py {sub} "
               f'--root-path {root} --out-dir {root} --extra-tag {sub}`')
    if not entries(root):
        return (f'generate synthetic data with `python tools/create_synthetic_data.py {sub} '
                f'--out {root}`, or {convert}')
    if synthetic_kind(root) == sub:
        return (f'{root} holds synthetic data ({MARKERS[sub]}): write it again with '
                f'`python tools/create_synthetic_data.py {sub} --out {root} --overwrite`, '
                f'or {convert}')
    return (f'{convert} ({root} holds files without the generator\'s {MARKERS[sub]} '
            'marker: real data, never a target for synthetic frames; for synthetic data '
            'see the end of this message)')


def _resolve(data_root: str, path: str) -> str:
    """mmengine's rule: relative paths are relative to ``data_root``."""
    return path if osp.isabs(path) or not data_root else osp.join(data_root, path)


def _file_problem(path: str) -> Optional[str]:
    """'does not exist' / 'is empty (0 bytes)' for a file that can't be an info file."""
    if not osp.isfile(path):
        return 'does not exist'
    if os.path.getsize(path) == 0:
        return 'is empty (0 bytes; an interrupted conversion or copy)'
    return None


def _check_dataset(ds: dict, where: str) -> List[str]:
    """Problems of one leaf dataset config (empty list: all paths exist)."""
    dtype = str(ds.get('type', 'dataset'))
    data_root = ds.get('data_root') or ''
    if _is_remote(data_root, ds):
        return []
    hint = _create_hint(dtype, data_root)
    if data_root and not osp.isdir(data_root):
        return [f'{where} ({dtype}): data_root {data_root!r} does not exist '
                f'(cwd {osp.abspath(".")!r}). Either {hint}, or point data_root at your '
                f'data: `--cfg-options {where}.data_root=PATH`.']
    problems = []
    ann_file = ds.get('ann_file')
    if ann_file and not _is_remote(ann_file, ds):
        path = _resolve(data_root, ann_file)
        problem = _file_problem(path)
        if problem:
            problems.append(f'{where} ({dtype}): info file ann_file={path!r} {problem}. '
                            f'To create it, {hint}.')
    pts = (ds.get('data_prefix') or {}).get('pts')
    if pts and (ds.get('modality') or {}).get('use_lidar', True):
        path = _resolve(data_root, pts)
        if not osp.isdir(path):
            problems.append(f'{where} ({dtype}): point-cloud folder data_prefix.pts='
                            f'{path!r} does not exist. To create it, {hint}.')
    for i, sampler in _db_samplers(ds):
        info = sampler.get('info_path')
        problem = None if not info or _is_remote(info, sampler) else _file_problem(info)
        if problem:
            step_type = ds['pipeline'][i].get('type')
            problems.append(f'{where}.pipeline[{i}] ({step_type}): ground-truth '
                            f'database db_sampler.info_path={info!r} {problem}. '
                            f'To create it, {hint}.')
    return problems


def _db_samplers(ds: dict) -> Iterator[Tuple[int, dict]]:
    """``(pipeline index, db_sampler cfg)`` of the dataset's ObjectSample steps."""
    for i, step in enumerate(ds.get('pipeline') or []):
        sampler = step.get('db_sampler') if isinstance(step, dict) else None
        if isinstance(sampler, dict):
            yield i, sampler


def _metrics(evaluator) -> List[dict]:
    return list(evaluator) if isinstance(evaluator, (list, tuple)) else [evaluator]


def _metric_type(metric: dict) -> str:
    mtype = metric.get('type')
    return getattr(mtype, '__name__', str(mtype))


def _check_evaluator(evaluator, where: str) -> List[str]:
    metrics = _metrics(evaluator)
    problems = []
    for i, metric in enumerate(metrics):
        if not isinstance(metric, dict) or not metric.get('ann_file'):
            continue
        # Metrics (KittiMetric, NuScenesMetric) open ann_file as given, not under data_root.
        path = metric['ann_file']
        problem = None if _is_remote(path, metric) else _file_problem(path)
        if problem:
            key = where if len(metrics) == 1 else f'{where}[{i}]'
            problems.append(f'{key} ({_metric_type(metric)}): ann_file={path!r} {problem}; '
                            'it is the info file of the evaluated split (see the '
                            'dataloader errors above, or fix the path with `--cfg-options '
                            f'{key}.ann_file=PATH`).')
    return problems


def _check_devkit_tables(evaluator, where: str, version: str,
                         missing_roots: Set[str]) -> List[str]:
    """NuScenesMetric runs the devkit's ``NuScenes(version, data_root)``: its tables."""
    metrics = _metrics(evaluator)
    problems = []
    for i, metric in enumerate(metrics):
        if (not isinstance(metric, dict) or _metric_type(metric) != 'NuScenesMetric'
                or metric.get('format_only') or _is_remote(metric.get('data_root', ''),
                                                           metric)):
            continue
        key = where if len(metrics) == 1 else f'{where}[{i}]'
        root = _norm(metric.get('data_root') or '')
        if root in missing_roots:
            continue  # reported with the dataset
        table_dir = osp.join(root, version)
        missing = [f'{t}.json' for t in NUSCENES_TABLES
                   if not osp.isfile(osp.join(table_dir, f'{t}.json'))]
        if not missing:
            continue
        what = (f'{table_dir}/ does not exist' if not osp.isdir(table_dir) else
                f'{table_dir}/ lacks {", ".join(missing)}')
        others = [d for d in entries(root) if d.startswith('v1.0-') and d != version
                  and osp.isdir(osp.join(root, d))]
        version_hint = (f' {root} holds {", ".join(others)}/: if those are your tables, '
                        f"set `metainfo=dict(version='{others[0]}')` on the datasets."
                        if others else '')
        problems.append(
            f'{key} (NuScenesMetric): the nuScenes devkit reads the database tables of '
            f'version {version!r} from data_root/{version}/, and {what}.{version_hint} '
            f'To create them, {_create_hint("NuScenesDataset", root)}.')
    return problems


def _dataset_version(cfg: Config, evaluator_key: str) -> str:
    """The nuScenes version the evaluated dataset reports (its metainfo, else mmdet3d's
    default), which is what NuScenesMetric passes to the devkit."""
    loader = cfg.get(evaluator_key.replace('evaluator', 'dataloader'))
    dataset = loader.get('dataset') if isinstance(loader, dict) else None
    for ds, _ in leaf_datasets(dataset, ''):
        version = (ds.get('metainfo') or {}).get('version')
        if version:
            return version
    return 'v1.0-trainval'


def _moved(path: str, old_root: str, new_root: str) -> str:
    """``path`` under ``old_root`` -> the same relative path under ``new_root``."""
    old = _norm(old_root)
    if old != '.' and (path == old or path.startswith(old + '/')):
        return new_root + path[len(old):].lstrip('/')
    return new_root + osp.basename(path)


def _dotted(where: str) -> str:
    """``a.datasets[1]`` -> ``a.datasets.1`` (the form ``--cfg-options`` takes)."""
    return where.replace('[', '.').replace(']', '')


def synthetic_overrides(cfg: Config, sub: str, new_root: str) -> List[str]:
    """``KEY=VALUE`` options that move every ``sub``-format dataset of ``cfg`` to
    ``new_root``: each loader's ``data_root``, ObjectSample's ``db_sampler.data_root``
    and ``info_path``, and the evaluators' ``ann_file`` (and ``data_root``).

    Args:
        cfg: the config the error is about.
        sub: 'kitti' or 'nuscenes' (the subcommand of tools/create_synthetic_data.py).
        new_root: the synthetic data folder, ending with '/'.
    """
    options, roots = [], []
    for key in _LOADERS:
        loader = cfg.get(key)
        dataset = loader.get('dataset') if isinstance(loader, dict) else None
        for ds, where in leaf_datasets(dataset, f'{key}.dataset'):
            if SYNTHETIC_SUBCOMMANDS.get(str(ds.get('type'))) != sub:
                continue
            old = ds.get('data_root') or ''
            roots.append(old)
            options.append(f'{_dotted(where)}.data_root={new_root}')
            for i, sampler in _db_samplers(ds):
                step = f'{_dotted(where)}.pipeline.{i}.db_sampler'
                if sampler.get('data_root') is not None:
                    options.append(f'{step}.data_root={new_root}')
                if sampler.get('info_path'):
                    options.append(f'{step}.info_path='
                                   f'{_moved(sampler["info_path"], old, new_root)}')
    for key in _EVALUATORS:
        metrics = _metrics(cfg.get(key)) if cfg.get(key) else []
        for i, metric in enumerate(metrics):
            if not isinstance(metric, dict):
                continue
            name = key if len(metrics) == 1 else f'{key}.{i}'
            for field in ('ann_file', 'data_root'):
                value = metric.get(field)
                if value:
                    old = next((r for r in roots if r and str(value).startswith(_norm(r))),
                               '')
                    moved = new_root if field == 'data_root' else _moved(value, old, new_root)
                    options.append(f'{name}.{field}={moved}')
    return list(dict.fromkeys(options))


def _separate_folder(sub: str, taken: Set[str]) -> str:
    """``data/synthetic_<sub>`` (or ``_2``, ...): a folder the generator may write."""
    n = 1
    while True:
        folder = f'data/synthetic_{sub}' + (f'_{n}' if n > 1 else '')
        if folder not in taken and _writable_by(folder, sub):
            return folder
        n += 1


def _synthetic_elsewhere(cfg: Config, foreign: Dict[str, Set[str]]) -> List[str]:
    """For each format whose configured data_root holds other data: the generator
    command into a separate folder and the options that point the config at it."""
    lines = []
    for sub, roots in sorted(foreign.items()):
        folder = _separate_folder(sub, roots)
        overwrite = ' --overwrite' if entries(folder) else ''
        options = ' '.join(synthetic_overrides(cfg, sub, folder + '/'))
        lines.append(
            f'for synthetic {sub} data instead, write it to a separate folder (never into '
            f'{", ".join(sorted(roots))}) and point the config at it:\n'
            f'      python tools/create_synthetic_data.py {sub} --out {folder}{overwrite}\n'
            f'      then add to the train/test command: --cfg-options {options}')
    return lines


def check_data_paths(cfg: Config, loaders: Sequence[str] = _LOADERS,
                     evaluators: Sequence[str] = _EVALUATORS) -> None:
    """Raise :class:`MissingDataError` listing every missing data path of ``cfg``.

    Args:
        cfg: a full training/testing config. Skipped when it sets
            ``preflight = dict(check_data=False)``.
        loaders: the dataloader keys the command will read (training: train, and val
            when it validates; testing: test). Default: all three.
        evaluators: the evaluator keys it will run. Default: val and test.
    """
    if not (cfg.get('preflight') or {}).get('check_data', True):
        return
    check_complete_synthetic(cfg, loaders)  # before the paths: it explains missing ones
    problems: List[str] = []
    seen = set()  # val and test often share a dataset: report each config once
    missing_roots: Set[str] = set()
    foreign: Dict[str, Set[str]] = {}  # format -> configured roots holding other data
    for key in loaders:
        loader = cfg.get(key)
        if not isinstance(loader, dict):
            continue
        for ds, where in leaf_datasets(loader.get('dataset'), f'{key}.dataset'):
            ident = repr((ds.get('data_root'), ds.get('ann_file'), ds.get('data_prefix')))
            if ident in seen:
                continue
            seen.add(ident)
            found = _check_dataset(ds, where)
            problems += found
            root = ds.get('data_root') or ''
            if root and not _is_remote(root, ds) and not osp.isdir(root):
                missing_roots.add(_norm(root))
            sub = SYNTHETIC_SUBCOMMANDS.get(str(ds.get('type')))
            if found and sub and not _writable_by(_norm(root), sub):
                foreign.setdefault(sub, set()).add(_norm(root))
    if not problems:  # evaluator paths repeat the loaders'; report them only alone
        for key in evaluators:
            if cfg.get(key):
                problems += _check_evaluator(cfg.get(key), key)
    for key in evaluators:
        if cfg.get(key):
            found = _check_devkit_tables(cfg.get(key), key, _dataset_version(cfg, key),
                                         missing_roots)
            problems += found
            for metric in _metrics(cfg.get(key)) if found else []:
                root = _norm((metric or {}).get('data_root') or '')
                if not _writable_by(root, 'nuscenes'):
                    foreign.setdefault('nuscenes', set()).add(root)
    if problems:
        problems += _synthetic_elsewhere(cfg, foreign)
        raise MissingDataError('missing data:\n  - ' + '\n  - '.join(problems)
                               + '\n' + OPT_OUT)
    check_data_files(cfg, loaders)
