"""What a point-cloud ``.bin`` file's size says about it, without reading it.

mmdet3d stores a point cloud as raw float32 values, ``load_dim`` per point (KITTI 4,
nuScenes 5). So a whole file is a non-zero multiple of ``4 * load_dim`` bytes; any other
size is a truncated copy or a file of another point dimension. The data preflight
(:mod:`mmdet3d_scaling.config.data_files`) checks every file of a dataset this way (one
``stat`` each), and the ``point_loading`` patch checks a file again just before numpy
reads it.
"""
from typing import Optional

__all__ = ['FLOAT32_BYTES', 'size_problem', 'size_fix']

FLOAT32_BYTES = 4


def size_problem(size: int, load_dim: int) -> Optional[str]:
    """Why a ``size``-byte file can't hold ``load_dim``-float32 points; None if it can."""
    if size == 0:
        return 'is empty (0 bytes)'
    if size % FLOAT32_BYTES:
        return (f'is {size} bytes, not a multiple of {FLOAT32_BYTES} (float32): the file '
                'is cut inside a value')
    if size % (FLOAT32_BYTES * load_dim):
        return (f'is {size} bytes = {size // FLOAT32_BYTES} float32 values, not a multiple '
                f'of load_dim={load_dim}: cut inside a point, or written with another '
                'point dimension')
    return None


def size_fix(load_dim: int) -> str:
    """What to do about a file :func:`size_problem` refuses."""
    return ('an interrupted copy or download leaves such files: copy the file again (or '
            'remove its frame from the info file); if every file is affected, check that '
            f'`load_dim` in the pipeline (now {load_dim}) matches the data (KITTI: 4, '
            'nuScenes: 5)')
