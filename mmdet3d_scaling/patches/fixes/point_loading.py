"""mmdet3d 1.4.0: name the file when a point cloud is corrupt or empty.

``LoadPointsFromFile`` and ``LoadPointsFromMultiSweeps`` read a ``.bin`` file as float32
and ``reshape(-1, load_dim)``. A truncated or wrong-format file fails deep in a data
loader worker with numpy's "buffer size must be a multiple of element size" (cut inside
a value) or "cannot reshape array of size N", naming neither the file nor the expected
point dimension; a zero-byte file (an interrupted copy) reshapes fine to zero points and
trains silently on a frame without data. The patch wraps their ``_load_points``: a local
``.bin`` file's size is checked before numpy reads it (a file may change after the data
preflight checked it), and what was read is checked after (remote files), raising
:class:`CorruptPointCloudError` (or its subclass :class:`EmptyPointCloudError`) naming
the file and the fix.
"""
import functools
import os
from typing import List

import numpy as np

from ...datasets.point_files import size_fix, size_problem
from ..patching import Change, Patch, declare

UPSTREAM = 'mmdet3d==1.4.0'


class CorruptPointCloudError(ValueError):
    """A point-cloud file whose size is not a multiple of the point dimension."""


class EmptyPointCloudError(CorruptPointCloudError):
    """A point-cloud file without a single point (zero bytes)."""


def check_point_count(points: np.ndarray, load_dim: int, filename: str) -> None:
    """Raise a clear error if ``points`` (flat float32) is empty or can't be
    ``load_dim`` columns."""
    if points.size == 0:
        raise EmptyPointCloudError(
            f'point cloud {filename} is empty (0 points): an interrupted copy or '
            'download leaves such files, and training on them would silently see a frame '
            'without points. Copy the file again (or regenerate synthetic data with '
            '`python tools/create_synthetic_data.py ... --overwrite`), or remove the frame '
            'from the info file.')
    if points.size % load_dim:
        size = os.path.getsize(filename) if os.path.isfile(filename) else points.nbytes
        raise CorruptPointCloudError(
            f'point cloud {filename} is corrupt: {points.size} float32 values '
            f'({size} bytes) is not a multiple of load_dim={load_dim}. Check that the '
            'file is complete and that `load_dim` in the pipeline matches the file '
            '(KITTI: 4, nuScenes: 5); regenerate synthetic data with '
            '`python tools/create_synthetic_data.py`.')


def check_point_file(filename: str, load_dim: int) -> None:
    """Raise a clear error if local file ``filename`` can't hold ``load_dim``-float32
    points (a ``stat``, no read); files that are not plain local ``.bin`` files pass."""
    if '://' in filename or not filename.endswith('.bin') or not os.path.isfile(filename):
        return  # remote, .npy (a header) or missing (upstream names a missing file)
    problem = size_problem(os.path.getsize(filename), load_dim)
    if problem is None:
        return
    error = EmptyPointCloudError if problem.startswith('is empty') else CorruptPointCloudError
    raise error(f'point cloud {filename} {problem}; {size_fix(load_dim)}. Synthetic data: '
                'write it again with `python tools/create_synthetic_data.py ... '
                '--overwrite`.')


def _checked(load_points):
    if getattr(load_points, '_mmdet3d_scaling_checked', False):
        return load_points

    @functools.wraps(load_points)
    def wrapper(self, pts_filename):
        if getattr(self, 'backend_args', None) is None:  # the local file system
            check_point_file(str(pts_filename), self.load_dim)
        points = load_points(self, pts_filename)
        check_point_count(points, self.load_dim, pts_filename)
        return points

    wrapper._mmdet3d_scaling_checked = True
    return wrapper


def _changes() -> List[Change]:
    from mmdet3d.datasets.transforms import loading
    return [Change(cls, '_load_points', _checked(cls._load_points))
            for cls in (loading.LoadPointsFromFile, loading.LoadPointsFromMultiSweeps)]


PATCH = declare(Patch(
    name='point_loading', kind='fixes',
    targets=('mmdet3d.datasets.transforms.loading.LoadPointsFromFile._load_points',
             'mmdet3d.datasets.transforms.loading.LoadPointsFromMultiSweeps._load_points'),
    upstream=UPSTREAM, changes=_changes,
    why='a truncated point file fails with numpy reshape, naming neither file nor '
        'point dimension, and a zero-byte one trains silently: errors that name the file'))
