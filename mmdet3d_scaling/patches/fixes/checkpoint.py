"""Safe checkpoint loading for mmengine 0.10.x on torch >= 2.6.

mmengine 0.10.7 calls ``torch.load(filename, map_location=...)`` without
``weights_only``. torch >= 2.6 defaults to ``weights_only=True`` and then refuses the
objects every mmengine checkpoint holds (the message hub's ``HistoryBuffer``, numpy
arrays in its logs), so ``--resume`` and ``load_from=`` break.

The shim re-registers mmengine's local-file and http(s) checkpoint schemes with a loader
that keeps ``weights_only=True`` and allows exactly the globals mmengine checkpoints
contain (:data:`MMENGINE_CHECKPOINT_GLOBALS`). A file that needs anything else is
refused with an error naming the globals; full unpickling (which can run arbitrary code)
happens only for files the user declared trusted, one by one:

- ``tools/train.py ... --trust-checkpoint PATH`` (repeatable; every rank parses it):
  trusted for the rest of the process, or
- ``trusted_checkpoints = ['PATH', ...]`` in the config: trusted while that runner
  builds, trains, validates or tests (``engine/run_settings.py``), then no longer, or
- ``MMDET3D_SCALING_TRUSTED_CHECKPOINTS=PATH1:PATH2`` in the environment, read only:
  the plugin never writes it, so child processes inherit nothing from a run.

There is deliberately no switch that trusts every file, and loading a trusted file logs
its path and the globals outside the allow-list that it holds (what full unpickling
accepted).

A file torch cannot read (truncated by a kill during the save, an interrupted copy, a
zero-byte file) raises :class:`CorruptCheckpointError` naming the file, its size and the
newest readable checkpoint in the same folder to use instead, for ``--resume``,
``load_from`` and ``tools/test.py`` alike (they all load through this scheme).
"""
import glob
import logging
import os
import os.path as osp
import pickle
import zipfile
from typing import Any, Iterable, List, Mapping, Optional

import torch

from ..patching import Change, Patch, declare

UPSTREAM = ('mmengine>=0.10,<0.11', 'torch>=2.0')
TRUSTED_ENV = 'MMDET3D_SCALING_TRUSTED_CHECKPOINTS'


class UntrustedCheckpointError(pickle.UnpicklingError):
    """A checkpoint holds objects outside the allow-list and was not declared trusted."""


def _numpy_globals() -> List[Any]:
    import numpy as np
    core = getattr(np, '_core', None) or np.core  # numpy 2 renamed core -> _core
    found = [np.ndarray, np.dtype, core.multiarray._reconstruct, core.multiarray.scalar]
    # numpy >= 1.25 pickles dtypes as instances of per-type classes (Float64DType, ...).
    dtypes = getattr(np, 'dtypes', None)
    if dtypes is not None:
        found += [getattr(dtypes, n) for n in dir(dtypes) if n.endswith('DType')]
    return found


_HISTORY_BUFFER_STATISTICS = {'min', 'max', 'current', 'mean'}


def history_buffer_method(owner: Any, name: str) -> Any:
    """Stands in for ``builtins.getattr`` while unpickling, limited to what it must do.

    A pickled ``HistoryBuffer`` holds its statistics methods (``HistoryBuffer.min``...),
    which pickle writes as ``getattr(HistoryBuffer, 'min')``. Allowing the real
    ``getattr`` would let a crafted file reach arbitrary attributes; this resolves only
    registered statistics methods of ``HistoryBuffer``.
    """
    from mmengine.logging.history_buffer import HistoryBuffer
    # The built-in statistics are registered lazily (in the first __init__), so a fresh
    # process knows them only by name; custom ones are registered at import time.
    known = _HISTORY_BUFFER_STATISTICS | set(HistoryBuffer._statistics_methods)
    if owner is HistoryBuffer and name in known:
        return getattr(owner, name)
    raise pickle.UnpicklingError(
        f'checkpoint asks for getattr({owner!r}, {name!r}); only HistoryBuffer '
        'statistics methods are allowed')


def mmengine_checkpoint_globals() -> List[Any]:
    """Everything a checkpoint written by mmengine 0.10's Runner unpickles to."""
    from mmengine.logging.history_buffer import HistoryBuffer
    from mmengine.config.config import ConfigDict
    return [HistoryBuffer, ConfigDict, (history_buffer_method, 'builtins.getattr'),
            *_numpy_globals()]


def _global_name(entry: Any) -> str:
    if isinstance(entry, tuple):
        return entry[1]
    return f'{entry.__module__}.{entry.__qualname__}'


_trusted: List[str] = []  # declared in this process: --trust-checkpoint, a run's config


def _absolute(path: Any) -> str:
    return osp.abspath(osp.expanduser(str(path)))


def trusted_paths() -> List[str]:
    """Absolute paths the user declared trusted (see module docstring)."""
    raw = os.environ.get(TRUSTED_ENV, '')
    known = [_absolute(p) for p in raw.split(os.pathsep) if p]
    return known + [p for p in _trusted if p not in known]


def trust_checkpoints(paths: Iterable[str]) -> None:
    """Declare checkpoint files trusted for full unpickling, in this process only
    (the environment is left alone: children inherit nothing)."""
    for path in paths:
        full = _absolute(path)
        if full not in _trusted:
            _trusted.append(full)


def declared_trusted() -> List[str]:
    """The paths declared trusted in this process (the environment's not included)."""
    return list(_trusted)


def set_declared_trusted(paths: Iterable[str]) -> None:
    """Replace the paths declared in this process (a run's end restores its start)."""
    _trusted[:] = [_absolute(p) for p in paths]


class CorruptCheckpointError(RuntimeError):
    """A checkpoint file that exists but torch cannot read (truncated, empty, not one)."""


class NotACheckpointError(CorruptCheckpointError):
    """A file given as a checkpoint that is whole but holds no checkpoint (another zip,
    a bare tensor, a list): no retry or copy makes it load."""


class MissingCheckpointError(FileNotFoundError):
    """A checkpoint path (given, or named by ``last_checkpoint``) that does not exist."""


def readable_zip(path: str) -> bool:
    """Whether ``path`` is a whole zip archive (torch's format since 1.6): its central
    directory, at the end of the file, is there; a cut file has none. Reads the end only."""
    try:
        with zipfile.ZipFile(path) as archive:
            return bool(archive.namelist())
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


_PICKLE_BOOKKEEPING = ('PROTO', 'FRAME', 'MEMOIZE', 'BINPUT', 'LONG_BINPUT', 'PUT')
#: pickle GLOBAL names of top-level mappings a checkpoint may be (torch.save of a dict,
#: of a model's state_dict)
_MAPPING_GLOBALS = ('collections OrderedDict', 'builtins dict', '__builtin__ dict')


def _pickle_top(head: bytes) -> str:
    """The top-level object of a pickle from its first opcodes: ``'mapping'`` or what
    else it starts with (a pickler writes the outer object first)."""
    import io
    import pickletools
    try:
        for op, arg, _ in pickletools.genops(io.BytesIO(head)):
            if op.name in _PICKLE_BOOKKEEPING:
                continue
            if op.name == 'EMPTY_DICT':
                return 'mapping'
            if op.name in ('GLOBAL', 'STACK_GLOBAL') and arg in _MAPPING_GLOBALS:
                return 'mapping'
            if op.name == 'GLOBAL' and arg:
                if arg.startswith('torch._utils _rebuild_'):
                    return 'a bare tensor'
                return f'a {arg.replace(" ", ".")} object'
            return {'EMPTY_LIST': 'a list', 'EMPTY_TUPLE': 'a tuple'}.get(
                op.name, f'an object that is not a dict (pickle opcode {op.name})')
    except Exception:  # noqa: BLE001  (head cut mid-opcode: judged by the full load)
        pass
    return 'mapping'


def checkpoint_problem(path: str) -> Optional[str]:
    """Why ``path`` is not a loadable checkpoint, or None when it looks like one: a
    whole torch zip whose pickle's top-level object is a dict. Cheap: the zip's central
    directory and the first bytes of its ``data.pkl`` (tensor data is never read)."""
    try:
        size = osp.getsize(path)
    except OSError as err:
        return f'cannot be opened ({err.strerror})'
    if size == 0:
        return 'is empty (0 bytes)'
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            pickles = [n for n in names if n.endswith('data.pkl') and n.count('/') == 1]
            if not pickles:
                shown = ', '.join(names[:5]) + (' ...' if len(names) > 5 else '')
                return (f'is a zip archive without torch data (no data.pkl; it holds '
                        f'{shown or "nothing"})')
            with archive.open(pickles[0]) as f:
                top = _pickle_top(f.read(256))
    except zipfile.BadZipFile:
        with open(path, 'rb') as f:
            legacy = f.read(2) == b'\x80\x02'  # torch < 1.6 format: a plain pickle
        return None if legacy else f'cannot be read ({size} bytes)'
    except (OSError, ValueError) as err:
        return f'cannot be read ({size} bytes): {err}'
    if top != 'mapping':
        return f'holds {top}, not the dict of a checkpoint'
    return None


def previous_checkpoint(filename: str) -> Optional[str]:
    """The newest other ``*.pth`` in ``filename``'s folder that loads as a checkpoint
    (:func:`checkpoint_problem`: a whole archive holding a dict)."""
    folder = osp.dirname(osp.abspath(filename))
    others = [p for p in glob.glob(osp.join(folder, '*.pth'))
              if osp.abspath(p) != osp.abspath(filename) and osp.isfile(p)]
    for path in sorted(others, key=osp.getmtime, reverse=True):
        if checkpoint_problem(path) is None and readable_zip(path):
            return path
    return None


def _instead(filename: str) -> str:
    previous = previous_checkpoint(filename)
    if previous is None:
        return 'No other readable checkpoint is in its folder'
    return (f'The newest readable checkpoint in the same folder is {previous}: use '
            f'it (`--resume {previous}`, `load_from={previous!r}` or `tools/test.py '
            f'CONFIG {previous}`)')


def corrupt_checkpoint_error(filename: str, err: BaseException) -> CorruptCheckpointError:
    """The error for checkpoint ``filename`` that failed to load with ``err``."""
    problem = checkpoint_problem(filename) or f'cannot be read ({osp.getsize(filename)} bytes)'
    if problem.startswith('is empty'):
        problem += ', not a checkpoint'
    elif not problem.startswith('cannot be read'):
        return not_a_checkpoint_error(filename, problem, err)
    return CorruptCheckpointError(
        f'checkpoint {filename} {problem}: {type(err).__name__}: {str(err).rstrip(".")}. '
        'A process killed '
        'while saving it, or an interrupted copy, leaves such files (with the plugin '
        "imported, mmengine's save_checkpoint writes through a temporary file and a "
        f'rename, so a new save is never cut). {_instead(filename)}, or copy the file again.')


def not_a_checkpoint_error(filename: str, problem: str,
                           err: Optional[BaseException] = None) -> NotACheckpointError:
    """The error for a file given as a checkpoint that holds none (``problem``)."""
    cause = f' ({type(err).__name__}: {str(err).strip().splitlines()[0][:200]})' \
        if err is not None and str(err).strip() else ''
    return NotACheckpointError(
        f'checkpoint {filename} {problem}: not a checkpoint{cause}. A checkpoint is what '
        "mmengine's CheckpointHook writes (work_dir/iter_N.pth, epoch_N.pth) or torch.save "
        f"of a dict (with 'state_dict' or the weights); check the path. {_instead(filename)}.")


def missing_checkpoint_error(filename: str) -> MissingCheckpointError:
    """The error for a checkpoint path that does not exist, saying whether the folder's
    ``last_checkpoint`` (mmengine's auto-resume pointer) names it."""
    folder = osp.dirname(osp.abspath(filename))
    pointer = osp.join(folder, 'last_checkpoint')
    named = ''
    try:
        with open(pointer) as f:
            if osp.abspath(f.read().strip()) == osp.abspath(filename):
                named = (f' ({pointer}, the pointer --resume follows, names it: the file '
                         'was deleted or moved after it was saved)')
    except OSError:
        pass
    folder_state = (_instead(filename) if osp.isdir(folder)
                    else f'its folder {folder} does not exist either')
    return MissingCheckpointError(
        f'checkpoint {filename} does not exist{named}. {folder_state}'
        + ('; or write that path into last_checkpoint.' if named else '.'))


def _torch_load(filename: str, **kwargs: Any) -> Any:
    """``torch.load`` naming a file it cannot read (see :class:`CorruptCheckpointError`)
    and one that holds no checkpoint (:class:`NotACheckpointError`)."""
    try:
        loaded = torch.load(filename, **kwargs)
    except (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile) as err:
        if checkpoint_problem(filename) is None and (
                readable_zip(filename) or isinstance(err, pickle.UnpicklingError)):
            raise  # a whole checkpoint with objects outside the allow-list: the caller's
        raise corrupt_checkpoint_error(filename, err) from err
    if not isinstance(loaded, Mapping):
        raise not_a_checkpoint_error(filename, checkpoint_problem(filename) or (
            f'holds a {type(loaded).__module__}.{type(loaded).__qualname__}, not the dict '
            'of a checkpoint'))
    return loaded


def _log_trusted(filename: str) -> None:
    """Say which file is unpickled fully, and what it holds beyond the allow-list."""
    from mmengine.logging import print_log
    known = {_global_name(a) for a in mmengine_checkpoint_globals()}
    extra = [g for g in _unsafe_globals(filename) if g not in known]
    held = (f'objects outside the mmengine allow-list it holds (accepted): '
            f'{", ".join(extra)}' if extra else
            'it holds no objects outside the mmengine allow-list')
    print_log(f'loading checkpoint {filename} with full unpickling (declared trusted by '
              f'--trust-checkpoint / trusted_checkpoints / {TRUSTED_ENV}); {held}',
              logger='current', level=logging.WARNING)


def _unsafe_globals(filename: str) -> List[str]:
    getter = getattr(torch.serialization, 'get_unsafe_globals_in_checkpoint', None)
    if getter is None:
        return []
    try:
        return sorted(getter(filename))
    except Exception:  # the file may not be a zip checkpoint; the error says enough
        return []


def load_checkpoint_file(filename: str, map_location: Any = None) -> Any:
    """``torch.load`` a checkpoint: allow-listed unless the file is declared trusted."""
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise missing_checkpoint_error(filename)
    if osp.abspath(filename) in trusted_paths():
        _log_trusted(filename)
        return _torch_load(filename, map_location=map_location, weights_only=False)
    safe_globals = getattr(torch.serialization, 'safe_globals', None)
    if safe_globals is None:  # torch < 2.5 has no allow-list API and loads fully anyway
        return _torch_load(filename, map_location=map_location)
    allowed = mmengine_checkpoint_globals()
    with safe_globals(allowed):
        try:
            return _torch_load(filename, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as err:
            known = {_global_name(a) for a in allowed}
            extra = [g for g in _unsafe_globals(filename) if g not in known]
            raise UntrustedCheckpointError(
                f'checkpoint {filename} contains objects outside the mmengine '
                f'allow-list{": " + ", ".join(extra) if extra else ""}. Loading it '
                'would run arbitrary code. If you trust this file, pass '
                f'`--trust-checkpoint {filename}` to tools/train.py or tools/test.py, '
                f'or add it to `trusted_checkpoints` in the config. Details: {err}'
            ) from err


def _node_local_rank(rank: int) -> int:
    """This process's rank on its node, from the launcher's variables.

    torchrun and mmengine's Slurm setup set ``LOCAL_RANK``; Open MPI sets
    ``OMPI_COMM_WORLD_LOCAL_RANK``, Slurm ``SLURM_LOCALID``. Without any of them the
    global rank stands in (one node).
    """
    for key in ('LOCAL_RANK', 'OMPI_COMM_WORLD_LOCAL_RANK', 'SLURM_LOCALID'):
        if key in os.environ:
            return int(os.environ[key])
    return rank


def _load_from_http(filename: str, map_location: Any = None,
                    model_dir: Optional[str] = None) -> Any:
    """Download once per node (its local rank 0), then load through the allow-list.

    Every node has its own cache (``$TORCH_HOME/checkpoints`` is usually node-local), so
    local rank 0 of each node downloads, not global rank 0 alone; the others wait for it.
    A failed download is reported on every rank (instead of leaving the others waiting
    at a barrier, or failing later with a FileNotFoundError for the cached file).
    """
    from mmengine.dist import get_dist_info
    from torch.hub import download_url_to_file, get_dir

    cache_dir = model_dir or osp.join(get_dir(), 'checkpoints')
    cached = osp.join(cache_dir, osp.basename(filename.split('?')[0]))
    rank, world_size = get_dist_info()
    error = None
    if _node_local_rank(rank) == 0 and not osp.isfile(cached):
        try:
            os.makedirs(cache_dir, exist_ok=True)
            download_url_to_file(filename, cached, progress=False)
        except Exception as err:  # noqa: BLE001  (reported on every rank below)
            error = f'rank {rank}: {type(err).__name__}: {err}'
    if world_size > 1:  # also the barrier: every node's download is done after it
        errors = [None] * world_size
        torch.distributed.all_gather_object(errors, error)
        error = next((e for e in errors if e is not None), None)
    if error is not None:
        raise RuntimeError(f'downloading checkpoint {filename} to {cached} failed ({error})')
    if not osp.isfile(cached):
        raise FileNotFoundError(
            f'checkpoint {filename} is not in this node\'s cache {cached} after the '
            'download: LOCAL_RANK does not say which process downloads on this node; set '
            'it (torchrun does), or download the file and give its path.')
    return load_checkpoint_file(cached, map_location)


def _changes() -> List[Change]:
    """Replace the loaders of mmengine's local and http(s) schemes (the scheme table is
    mmengine's extension point for checkpoint loading)."""
    from mmengine.runner.checkpoint import CheckpointLoader
    schemes = CheckpointLoader._schemes
    return [Change(schemes, '', load_checkpoint_file),
            Change(schemes, 'http://', _load_from_http),
            Change(schemes, 'https://', _load_from_http)]


PATCH = declare(Patch(
    name='checkpoint', kind='fixes',
    targets=('mmengine.runner.checkpoint.CheckpointLoader._schemes',),
    upstream=UPSTREAM, changes=_changes,
    why='torch >= 2.6 refuses mmengine checkpoints (torch.load without weights_only): '
        'weights_only with an allow-list, full unpickling only for trusted files'))
