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
"""
import io
from typing import Any, Callable, List, Optional

from ...utils.atomic_io import atomic_write
from ..patching import Change, Patch, declare

UPSTREAM = 'mmengine>=0.10,<0.11'
#: modules that bind ``save_checkpoint`` at import (the hooks and strategies look it up
#: in these at call time)
OWNERS = ('mmengine.runner.checkpoint', 'mmengine.runner', 'mmengine.runner.runner')


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
            atomic_write(str(filename), f.getvalue())

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
