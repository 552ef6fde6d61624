"""Write a file so that its name always holds a whole file: temp file, fsync, rename.

A process killed while writing ``open(path, 'wb').write(...)`` leaves a truncated file
under the final name, and readers (a resume, a training run) cannot tell it from a good
one. :func:`atomic_write` writes into a temporary file beside ``path`` (same folder,
hence same file system), flushes it to disk and renames it over ``path``: a rename
within a file system is atomic on POSIX, so ``path`` is either the old file or the
new one. A kill leaves at most a hidden ``.NAME.*.partial`` file beside it.
"""
import contextlib
import os
import os.path as osp
import tempfile
from typing import BinaryIO, Iterator

__all__ = ['PARTIAL_SUFFIX', 'atomic_writer', 'atomic_write']

#: suffix of the temporary files (``.iter_4.pth.<random>.partial``)
PARTIAL_SUFFIX = '.partial'


def _umask() -> int:
    """The process umask (os has no getter: set a common value and put it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync_folder(folder: str) -> None:
    """Persist the rename itself (the folder entry); not possible on every OS."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_writer(path: str, fsync: bool = True) -> Iterator[BinaryIO]:
    """Yield a binary file whose content replaces ``path`` when the block ends.

    Args:
        path: the final file name; its folder is created if missing.
        fsync: flush the data (and the rename) to disk before returning. Defaults to
            True; without it a power loss may still leave an empty file.

    On an exception inside the block the temporary file is removed and ``path`` is
    left as it was.
    """
    folder = osp.dirname(osp.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f'.{osp.basename(path)}.', suffix=PARTIAL_SUFFIX,
                               dir=folder)
    try:
        with os.fdopen(fd, 'wb') as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; open() would not
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    if fsync:
        _fsync_folder(folder)


def atomic_write(path: str, data: bytes, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_writer`)."""
    with atomic_writer(path, fsync=fsync) as f:
        f.write(data)
