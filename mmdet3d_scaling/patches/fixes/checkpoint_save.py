"""mmengine 0.10: a checkpoint file under its final name is always whole.

``mmengine.runner.checkpoint.save_checkpoint`` serialises the checkpoint and hands the
bytes to the file backend, whose local ``put`` opens ``iter_N.pth`` for writing and
writes into it. A process killed during that write (SIGKILL, out of memory, a node
lost) leaves a truncated ``iter_N.pth``, and ``last_checkpoint`` may already name it:
``--resume`` then fails with torch's "PytorchStreamReader failed reading zip archive",
or auto-resume picks the broken file.

The patch writes local checkpoints through :func:`mmdet3d_scaling.utils.atomic_io.atomic_write`:
a temporary file in the same folder, fsync, rename. ``iter_N.pth`` is the old file or the
whole new one; a kill leaves at most a hidden ``.iter_N.pth.*.partial`` beside it.
Only ``save_checkpoint`` changes (no other file mmengine writes), and only for local
paths without ``backend_args`` / ``file_client_args``: other backends and ``pavi://``
go to upstream's code. The bytes written are upstream's (``torch.save`` of the same dict).

A save that fails (disk full, the file-size limit, a read-only folder) raises
:class:`CheckpointSaveError` naming the checkpoint, its size and the folder's free space,
and saying that the previous checkpoint and ``last_checkpoint`` are intact (mmengine's
CheckpointHook writes ``last_checkpoint`` only after a save returns).
"""
import errno
import io
import os.path as osp
import shutil
from typing import Any, Callable, List, Optional

from ...utils.atomic_io import atomic_write
from ..patching import Change, Patch, declare

UPSTREAM = 'mmengine>=0.10,<0.11'
#: modules that bind ``save_checkpoint`` at import (the hooks and strategies look it up
#: in these at call time)
OWNERS = ('mmengine.runner.checkpoint', 'mmengine.runner', 'mmengine.runner.runner')


class CheckpointSaveError(OSError):
    """A local checkpoint save that failed; nothing under the final name changed.
    ``errno`` / ``strerror`` / ``filename`` are the failed write's; ``str()`` is the
    whole message."""

    def __init__(self, message: str, err: OSError, filename: str) -> None:
        super().__init__(err.errno, err.strerror, filename)
        self.message = message

    def __str__(self) -> str:
        return self.message


def _previous(folder: str) -> str:
    """What ``last_checkpoint`` in ``folder`` names, for the error (or that none is)."""
    pointer = osp.join(folder, 'last_checkpoint')
    try:
        with open(pointer) as f:
            return f'{pointer} (still naming {f.read().strip()})'
    except OSError:
        return f'{pointer} (none was written before)'


def save_error(filename: str, n_bytes: int, err: OSError) -> CheckpointSaveError:
    """The error for a save of ``n_bytes`` to ``filename`` that failed with ``err``."""
    folder = osp.dirname(osp.abspath(filename))
    try:
        free = f'{shutil.disk_usage(folder).free / 2**20:.1f} MiB free there'
    except OSError:
        free = 'free space unknown'
    fix = {errno.ENOSPC: 'free disk space there (`df -h ' + folder + '`) or set a '
                         "work_dir on a larger disk",
           errno.EFBIG: 'the process file-size limit (`ulimit -f`) is below the '
                        'checkpoint size: raise it',
           errno.EDQUOT: 'the disk quota is used up: free space or raise the quota',
           errno.EACCES: 'the folder is not writable: fix its permissions',
           errno.EROFS: 'the file system is read-only: use another work_dir'}.get(
        err.errno, 'fix the cause')
    previous = 'the previous ' + osp.basename(filename) if osp.exists(filename) else \
        'the previous checkpoints'
    return CheckpointSaveError(
        f'saving checkpoint {filename} ({n_bytes / 2**20:.1f} MiB; {free}) failed: '
        f'{err.strerror or err}. Nothing under that name changed: {previous} and '
        f'{_previous(folder)} are intact. {fix[0].upper() + fix[1:]}, then resume '
        'with tools/train.py CONFIG --resume.', err, filename)


def _local(filename: str) -> bool:
    from mmengine.fileio import get_file_backend
    from mmengine.fileio.backends import LocalBackend
    if str(filename).startswith('pavi://'):
        return False
    return isinstance(get_file_backend(filename, backend_args=None), LocalBackend)


def atomic_save_checkpoint(upstream: Callable) -> Callable:
    """``save_checkpoint`` writing local files by temp file + fsync + rename."""

    def save_checkpoint(checkpoint: dict, filename: str,
                        file_client_args: Optional[dict] = None,
                        backend_args: Optional[dict] = None) -> None:
        if file_client_args is not None or backend_args is not None or not _local(filename):
            return upstream(checkpoint, filename, file_client_args, backend_args)
        import torch
        with io.BytesIO() as f:
            torch.save(checkpoint, f)
            data = f.getvalue()
        try:
            atomic_write(str(filename), data)
        except OSError as err:
            raise save_error(str(filename), len(data), err) from err

    save_checkpoint.__doc__ = upstream.__doc__
    save_checkpoint.original = upstream
    return save_checkpoint


def _changes() -> List[Change]:
    import importlib
    from mmengine.runner import checkpoint
    replacement = atomic_save_checkpoint(checkpoint.save_checkpoint)
    owners: List[Any] = [importlib.import_module(name) for name in OWNERS]
    return [Change(owner, 'save_checkpoint', replacement) for owner in owners]


PATCH = declare(Patch(
    name='checkpoint_save', kind='fixes',
    targets=tuple(f'{name}.save_checkpoint' for name in OWNERS),
    upstream=UPSTREAM, changes=_changes,
    why='a process killed while saving leaves a truncated iter_N.pth that resume '
        'picks: local checkpoints written to a temp file, fsynced and renamed'))
