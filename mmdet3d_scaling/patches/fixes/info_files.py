"""mmengine 0.10 / mmdet3d 1.4.0: name the info file when it cannot be read.

Datasets (``BaseDataset.load_data_list``), the KITTI and nuScenes metrics and the
ObjectSample database (``DataBaseSampler``) read their ``.pkl`` info files with
mmengine's ``load``. An empty file (an interrupted converter or copy) fails with
``EOFError: Ran out of input``, a truncated one with ``UnpicklingError: pickle data was
truncated``: neither names the file, nor how to make it again. The patch wraps exactly
those reads and raises :class:`CorruptInfoFileError` naming the file, its size and the
command that regenerates it (chained to the original error). Missing files are left to
upstream's ``FileNotFoundError``, which names them already. An info file of the
structure before mmdet3d 1.0 (a bare list, or a dict with ``infos``), which mmengine
refuses with ``TypeError: The annotations loaded from annotation file should be a
dict`` or ``Annotation must have data_list and metainfo keys`` (no file named), raises
:class:`OldInfoFormatError` naming the file and mmdet3d's converter command.
"""
import functools
import os
import os.path as osp
from typing import Any, Callable, List

from ...datasets.info_format import info_structure_problem, update_hint
from ..patching import Change, Patch, declare

UPSTREAM = ('mmengine>=0.10,<0.11', 'mmdet3d==1.4.0')
_FILEIO = f'{os.sep}mmengine{os.sep}fileio{os.sep}'


class CorruptInfoFileError(ValueError):
    """An info (annotation) file that exists but cannot be parsed."""


def regenerate_hint(path: str) -> str:
    """How to write ``path`` again: the synthetic generator for a folder it made, else
    mmdet3d's converter for the dataset the file name says."""
    from mmdet3d_scaling.datasets.synthetic.target import synthetic_kind
    folder = osp.dirname(osp.abspath(path))
    kind = synthetic_kind(folder)
    if kind is not None:
        return (f'it is synthetic data: write it again with `python '
                f'tools/create_synthetic_data.py {kind} --out {folder} --overwrite`')
    name = osp.basename(path)
    dataset = next((d for d in ('kitti', 'nuscenes', 'waymo', 'lyft', 's3dis', 'scannet',
                                'sunrgbd') if name.startswith(d)), None)
    if dataset is None:
        return ("regenerate it with mmdet3d's `tools/create_data.py` for its dataset (see "
                'the mmdet3d 1.4 dataset docs)')
    return (f"regenerate it with mmdet3d's `python tools/create_data.py {dataset} "
            f'--root-path {folder} --out-dir {folder} --extra-tag {dataset}`')


def corrupt_info_error(path: Any, err: BaseException) -> CorruptInfoFileError:
    """The error for info file ``path`` that failed to parse with ``err``."""
    path = str(getattr(path, 'name', path))  # a file object names its path
    size = os.path.getsize(path) if osp.isfile(path) else None
    state = ('is empty (0 bytes)' if size == 0 else
             f'cannot be read ({size} bytes)' if size is not None else 'cannot be read')
    return CorruptInfoFileError(
        f'info file {path} {state}: {type(err).__name__}: {err}. An interrupted '
        f'conversion or copy leaves such files; {regenerate_hint(path)}.')


class OldInfoFormatError(CorruptInfoFileError):
    """An info file of the structure before mmdet3d 1.0, which 1.x cannot read."""


def old_format_error(path: Any, loaded: Any) -> Any:
    """:class:`OldInfoFormatError` when ``loaded`` (info file ``path``'s content) has a
    pre-1.0 structure; None otherwise (mmengine checks the rest)."""
    if not (isinstance(loaded, list) or (isinstance(loaded, dict) and 'infos' in loaded
                                         and 'data_list' not in loaded)):
        return None
    path = str(getattr(path, 'name', path))
    name = osp.basename(path)
    dataset = next((d for d in ('kitti', 'nuscenes', 'waymo', 'lyft', 's3dis', 'scannet',
                                'sunrgbd') if name.startswith(d)), 'kitti')
    return OldInfoFormatError(f'info file {path} {info_structure_problem(loaded)}; '
                              f'{update_hint(path, dataset)}.')


def _unreadable(err: BaseException) -> bool:
    """A parse error (finding or opening the file already names it: OSError)."""
    return isinstance(err, Exception) and not isinstance(err, OSError)


def _raised_in_fileio(err: BaseException) -> bool:
    """Whether ``err`` came from inside mmengine's file loading."""
    tb = err.__traceback__
    while tb is not None:
        if _FILEIO in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False


def _named_load(load: Callable) -> Callable:
    """mmengine's ``load`` as bound in one upstream module, naming a bad file."""

    @functools.wraps(load)
    def wrapper(file, *args, **kwargs):
        try:
            loaded = load(file, *args, **kwargs)
        except Exception as err:
            if _unreadable(err):
                raise corrupt_info_error(file, err) from err
            raise
        old = old_format_error(file, loaded)
        if old is not None:
            raise old
        return loaded

    return wrapper


def _named_db_sampler_init(init: Callable) -> Callable:
    """``DataBaseSampler.__init__`` naming ``info_path`` when its pickle is bad."""

    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        try:
            init(self, *args, **kwargs)
        except Exception as err:
            if _unreadable(err) and _raised_in_fileio(err):
                raise corrupt_info_error(self.info_path, err) from err
            raise

    return wrapper


#: modules whose ``load`` reads an ann_file: the dataset base class and the metrics
_LOAD_MODULES = ('mmengine.dataset.base_dataset',
                 'mmdet3d.evaluation.metrics.kitti_metric',
                 'mmdet3d.evaluation.metrics.nuscenes_metric')


def _changes() -> List[Change]:
    import importlib

    from mmdet3d.datasets.transforms.dbsampler import DataBaseSampler
    changes = []
    for name in _LOAD_MODULES:
        module = importlib.import_module(name)
        changes.append(Change(module, 'load', _named_load(module.load)))
    changes.append(Change(DataBaseSampler, '__init__',
                          _named_db_sampler_init(DataBaseSampler.__init__)))
    return changes


PATCH = declare(Patch(
    name='info_files', kind='fixes',
    targets=tuple(f'{name}.load' for name in _LOAD_MODULES)
    + ('mmdet3d.datasets.transforms.dbsampler.DataBaseSampler.__init__',),
    upstream=UPSTREAM, changes=_changes,
    why='an empty or truncated info .pkl fails with "EOFError: Ran out of input", '
        'naming no file: an error that names the file and how to regenerate it'))
