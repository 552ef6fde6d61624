"""Check a config's data paths before the Runner starts, and say how to fix them.

Without this, a missing dataset fails late (when the first dataloader is built,
possibly after minutes of model setup) with a bare ``FileNotFoundError`` from deep
inside mmengine. :func:`check_data_paths` runs from
:class:`mmdet3d_scaling.engine.ScalingRunner` at the start of ``train()`` / ``val()`` /
``test()`` and reports, for the dataloaders that command reads (through RepeatDataset,
ConcatDataset, CBGSDataset and other wrappers) and their evaluators:

- a missing ``data_root``;
- a missing info file (``ann_file``) or ObjectSample database (``db_sampler.info_path``);
- a missing point-cloud folder (``data_prefix.pts``);

each with the command that creates it. Paths on remote storage (``backend_args`` set,
or a URL) are not checked. A config can skip the check with
``preflight = dict(check_data=False)`` (e.g. a test that never loads data).
"""
import os.path as osp
from typing import Iterator, List, Optional, Sequence, Tuple

from mmengine.config import Config

__all__ = ['MissingDataError', 'check_data_paths', 'leaf_datasets']

#: dataset type -> subcommand of tools/create_synthetic_data.py that writes its format
SYNTHETIC_SUBCOMMANDS = {'KittiDataset': 'kitti', 'NuScenesDataset': 'nuscenes'}
_LOADERS = ('train_dataloader', 'val_dataloader', 'test_dataloader')
_EVALUATORS = ('val_evaluator', 'test_evaluator')


class MissingDataError(FileNotFoundError):
    """A data path named in the config does not exist."""


def leaf_datasets(dataset: Optional[dict], where: str) -> Iterator[Tuple[dict, str]]:
    """Yield ``(dataset cfg, its key path)`` of the real datasets inside wrappers."""
    if not isinstance(dataset, dict):
        return
    if isinstance(dataset.get('dataset'), dict):  # RepeatDataset, CBGSDataset, ...
        yield from leaf_datasets(dataset['dataset'], f'{where}.dataset')
    elif isinstance(dataset.get('datasets'), (list, tuple)):  # ConcatDataset
        for i, child in enumerate(dataset['datasets']):
            yield from leaf_datasets(child, f'{where}.datasets[{i}]')
    else:
        yield dataset, where


def _is_remote(path: str, cfg: dict) -> bool:
    return '://' in str(path) or cfg.get('backend_args') is not None


def _create_hint(dataset_type: str, data_root: str) -> str:
    sub = SYNTHETIC_SUBCOMMANDS.get(dataset_type)
    root = data_root.rstrip('/') or '.'
    if sub is None:
        return (f"prepare {dataset_type} with mmdet3d's `tools/create_data.py` "
                '(see the mmdet3d 1.4 dataset docs)')
    return (f'generate synthetic data with `python tools/create_synthetic_data.py {sub} '
            f'--out {root}`, or convert the real dataset with mmdet3d\'s '
            f'`python tools/create_data.py {sub} --root-path {root} --out-dir {root} '
            f'--extra-tag {sub}`')


def _resolve(data_root: str, path: str) -> str:
    """mmengine's rule: relative paths are relative to ``data_root``."""
    return path if osp.isabs(path) or not data_root else osp.join(data_root, path)


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
        if not osp.isfile(path):
            problems.append(f'{where} ({dtype}): info file ann_file={path!r} does not '
                            f'exist. To create it, {hint}.')
    pts = (ds.get('data_prefix') or {}).get('pts')
    if pts and (ds.get('modality') or {}).get('use_lidar', True):
        path = _resolve(data_root, pts)
        if not osp.isdir(path):
            problems.append(f'{where} ({dtype}): point-cloud folder data_prefix.pts='
                            f'{path!r} does not exist. To create it, {hint}.')
    for i, step in enumerate(ds.get('pipeline') or []):
        sampler = step.get('db_sampler') if isinstance(step, dict) else None
        info = sampler.get('info_path') if isinstance(sampler, dict) else None
        if info and not _is_remote(info, sampler) and not osp.isfile(info):
            problems.append(f'{where}.pipeline[{i}] ({step.get("type")}): ground-truth '
                            f'database db_sampler.info_path={info!r} does not exist. '
                            f'To create it, {hint}.')
    return problems


def _check_evaluator(evaluator, where: str) -> List[str]:
    metrics = evaluator if isinstance(evaluator, (list, tuple)) else [evaluator]
    problems = []
    for i, metric in enumerate(metrics):
        if not isinstance(metric, dict) or not metric.get('ann_file'):
            continue
        # Metrics (KittiMetric, NuScenesMetric) open ann_file as given, not under data_root.
        path = metric['ann_file']
        if not _is_remote(path, metric) and not osp.isfile(path):
            key = where if len(metrics) == 1 else f'{where}[{i}]'
            problems.append(f'{key} ({metric.get("type")}): ann_file={path!r} does not '
                            'exist; it is the info file of the evaluated split (see the '
                            'dataloader errors above, or fix the path with `--cfg-options '
                            f'{key}.ann_file=PATH`).')
    return problems


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
    problems: List[str] = []
    seen = set()  # val and test often share a dataset: report each config once
    for key in loaders:
        loader = cfg.get(key)
        if isinstance(loader, dict):
            for ds, where in leaf_datasets(loader.get('dataset'), f'{key}.dataset'):
                ident = repr((ds.get('data_root'), ds.get('ann_file'), ds.get('data_prefix')))
                if ident not in seen:
                    seen.add(ident)
                    problems += _check_dataset(ds, where)
    if not problems:  # evaluator paths repeat the loaders'; report them only alone
        for key in evaluators:
            if cfg.get(key):
                problems += _check_evaluator(cfg.get(key), key)
    if problems:
        raise MissingDataError('missing data:\n  - ' + '\n  - '.join(problems))
