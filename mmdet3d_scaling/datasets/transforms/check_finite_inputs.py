"""CheckFiniteInputs: refuse a sample whose points or images hold NaN or inf."""
from typing import Any, List, Sequence

import numpy as np
from mmcv.transforms import BaseTransform

from mmdet3d.registry import TRANSFORMS
from ...registry import register

_FILE_KEYS = ('sample_idx', 'lidar_path', 'img_path')


def _as_array(value: Any) -> np.ndarray:
    tensor = getattr(value, 'tensor', value)  # mmdet3d BasePoints
    if hasattr(tensor, 'detach'):
        tensor = tensor.detach().cpu().numpy()
    return np.asarray(tensor)


def _names(results: dict) -> str:
    """``sample_idx=..., lidar_path=..., img_path=...`` of a sample (what it has)."""
    found = {k: results.get(k) for k in _FILE_KEYS}
    if found['lidar_path'] is None:
        found['lidar_path'] = (results.get('lidar_points') or {}).get('lidar_path')
    if found['img_path'] is None and isinstance(results.get('images'), dict):
        found['img_path'] = [cam.get('img_path') for cam in results['images'].values()
                             if isinstance(cam, dict) and cam.get('img_path')] or None
    return ', '.join(f'{k}={v!r}' for k, v in found.items() if v is not None) or \
        '(no sample_idx / lidar_path / img_path in the results)'


@register(TRANSFORMS)
class CheckFiniteInputs(BaseTransform):
    """Raise a ``ValueError`` naming the file when an input holds NaN or inf.

    Put it after the loading transforms of the train pipeline, e.g.
    ``dict(type='CheckFiniteInputs')`` after ``LoadPointsFromFile``. The error names
    ``sample_idx`` / ``lidar_path`` / ``img_path``, the key, how many values are not
    finite and in which columns (points: x, y, z, intensity, ...). Costs one
    ``np.isfinite`` pass over each checked array.

    Args:
        keys (Sequence[str]): result keys to check; a missing key is skipped (a
            pipeline without images). Defaults to ``('points', 'img')``.
    """

    def __init__(self, keys: Sequence[str] = ('points', 'img')) -> None:
        if isinstance(keys, str) or not all(isinstance(k, str) for k in keys):
            raise TypeError(f"CheckFiniteInputs: keys must be a list of result keys such "
                            f"as ['points', 'img'], got {keys!r}.")
        self.keys = tuple(keys)

    def transform(self, results: dict) -> dict:
        """Check ``results[key]`` for every configured key; return ``results``."""
        problems: List[str] = []
        for key in self.keys:
            if results.get(key) is None:
                continue
            values = results[key]
            arrays = values if isinstance(values, (list, tuple)) else [values]
            for i, value in enumerate(arrays):
                problem = self._describe(_as_array(value))
                if problem:
                    where = f'{key}[{i}]' if len(arrays) > 1 else key
                    problems.append(f'{where}: {problem}')
        if problems:
            raise ValueError(
                f'CheckFiniteInputs: non-finite input in sample {_names(results)}: '
                + '; '.join(problems) + '. Fix or drop this file (or regenerate the '
                'info files without it).')
        return results

    @staticmethod
    def _describe(array: np.ndarray) -> str:
        if not np.issubdtype(array.dtype, np.floating):
            return ''
        bad = ~np.isfinite(array)
        count = int(bad.sum())
        if not count:
            return ''
        text = f'{count} of {array.size} values are NaN or inf'
        if array.ndim == 2:
            columns = np.flatnonzero(bad.any(axis=0)).tolist()
            text += f' (column(s) {columns})'
        return text

    def __repr__(self) -> str:
        return f'{type(self).__name__}(keys={list(self.keys)})'
