"""Where a synthetic-data writer may write, and how its folders are recognised.

A writer refuses a folder that already holds anything (it could be a real dataset, and
writing frames over it would replace the user's files) unless the caller passes
``overwrite=True`` (``--overwrite`` on the command line). Every writer leaves a marker
file in the root it writes (``.synthetic_kitti``, ``.synthetic_nuscenes``): a small JSON
record of the generator and its arguments. The marker is written first, with
``"complete": false``, so a folder an interrupted run left behind is still recognised as
generator-made; tools that may regenerate data on their own (``tools/demo.py``) and the
data preflight (:mod:`mmdet3d_scaling.config.preflight`) use it to tell synthetic data
from real data. The writer replaces its info files atomically (temp file + rename) after
every frame file, and only then sets ``"complete": true`` (:func:`mark_complete`): a run
killed part way (say an ``--overwrite`` over an older set) leaves a marker that says
incomplete, and the preflight refuses the folder (:func:`incomplete_run`) instead of
training on infos of one run and point files of another.
"""
import json
import os
import os.path as osp
from typing import List, Mapping, Optional

from ...utils.atomic_io import atomic_write

__all__ = ['MARKERS', 'TargetNotEmptyError', 'entries', 'describe_entries',
           'synthetic_kind', 'holds_foreign_data', 'check_target', 'write_marker',
           'mark_complete', 'incomplete_run', 'regenerate_command']

#: dataset format -> the marker file its writer leaves in the dataset root
MARKERS = {'kitti': '.synthetic_kitti', 'nuscenes': '.synthetic_nuscenes'}


class TargetNotEmptyError(FileExistsError):
    """A writer was pointed at a non-empty folder without ``overwrite``."""


def entries(folder: str) -> List[str]:
    """Sorted names in ``folder`` (empty when it does not exist)."""
    return sorted(os.listdir(folder)) if osp.isdir(folder) else []


def describe_entries(names: List[str], limit: int = 5) -> str:
    """``'3 entries: a, b, c'``, the first ``limit`` names and the count."""
    shown = ', '.join(names[:limit]) + (', ...' if len(names) > limit else '')
    return f'{len(names)} entr{"y" if len(names) == 1 else "ies"}: {shown}'


def synthetic_kind(folder: str) -> Optional[str]:
    """The format whose generator marker is in ``folder`` ('kitti', ...), else None."""
    for kind, marker in MARKERS.items():
        if osp.isfile(osp.join(folder, marker)):
            return kind
    return None


def holds_foreign_data(folder: str) -> bool:
    """True when ``folder`` holds files and no generator marker: treat it as real data."""
    return bool(entries(folder)) and synthetic_kind(folder) is None


def check_target(out_dir: str, dataset: str, overwrite: bool) -> None:
    """Raise unless a ``dataset`` writer may write into ``out_dir``.

    Args:
        out_dir: the dataset root the writer was given.
        dataset: the format ('kitti', 'nuscenes'): names the marker in the message.
        overwrite: allow a non-empty folder (files of the same names are replaced,
            other files are kept).

    Raises:
        NotADirectoryError: ``out_dir`` is a file.
        TargetNotEmptyError: ``out_dir`` holds anything and ``overwrite`` is False; the
            message names the folder, a few of its entries, the count and the switch.
    """
    if osp.exists(out_dir) and not osp.isdir(out_dir):
        raise NotADirectoryError(f'--out {out_dir!r} is a file, not a folder: pick a '
                                 'folder for the synthetic dataset')
    names = entries(out_dir)
    if not names or overwrite:
        return
    marker = MARKERS[dataset]
    if synthetic_kind(out_dir) == dataset:
        origin = f'it was written by this generator before ({marker} is there)'
    else:
        origin = (f'it has no generator marker ({marker}), so it may hold real data; '
                  'never overwrite a real dataset with synthetic frames')
    raise TargetNotEmptyError(
        f'refusing to write synthetic {dataset} data into {out_dir!r}: the folder is not '
        f'empty ({describe_entries(names)}); {origin}. Pick a new or empty --out, or '
        'pass --overwrite (Python: overwrite=True) to write into it anyway: files with '
        'the same names are replaced, others are kept.')


def write_marker(out_dir: str, dataset: str, arguments: Mapping[str, object],
                 complete: bool = False) -> str:
    """Write ``out_dir``'s marker atomically (same arguments, same bytes); returns its
    path. A writer calls it first with ``complete=False`` and :func:`mark_complete` last."""
    os.makedirs(out_dir, exist_ok=True)
    path = osp.join(out_dir, MARKERS[dataset])
    record = dict(generator='mmdet3d_scaling.datasets.synthetic', dataset=dataset,
                  arguments=dict(arguments), complete=complete)
    text = json.dumps(record, indent=1, sort_keys=True, default=str) + '\n'
    atomic_write(path, text.encode())
    return path


def _read_marker(folder: str, dataset: str) -> Optional[dict]:
    try:
        with open(osp.join(folder, MARKERS[dataset])) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def mark_complete(out_dir: str, dataset: str) -> str:
    """Set ``"complete": true`` in the marker: every file of the run is in place."""
    record = _read_marker(out_dir, dataset) or {}
    return write_marker(out_dir, dataset, record.get('arguments', {}), complete=True)


def regenerate_command(folder: str, dataset: str) -> str:
    """The generator command that writes ``folder`` again with the marker's arguments
    (frame counts and seed; other options need repeating by hand)."""
    args = (_read_marker(folder, dataset) or {}).get('arguments', {})
    flags = ''.join(f' --{key.replace("_", "-")} {args[key]}'
                    for key in ('train_frames', 'val_frames', 'seed') if key in args)
    return (f'python tools/create_synthetic_data.py {dataset} --out {folder.rstrip("/")}'
            f'{flags} --overwrite')


def incomplete_run(folder: str) -> Optional[str]:
    """The format of an unfinished generator run in ``folder`` ('kitti', ...), else None.

    A marker written before completion was recorded (no ``complete`` key) counts as
    complete: nothing says otherwise.
    """
    kind = synthetic_kind(folder)
    if kind is None:
        return None
    record = _read_marker(folder, kind)
    if record is None:  # unreadable marker: the writer died inside it
        return kind
    return kind if record.get('complete', True) is False else None
