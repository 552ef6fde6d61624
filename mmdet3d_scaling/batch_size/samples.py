"""Trial batches for the batch size search: the dataset's largest samples, or random ones.

:class:`LargestSampleBatches` ranks samples by point-file bytes and box count
(:func:`rank_largest`, reading only file sizes and annotations) so the search tries the
batches that need the most memory; :class:`RandomSampleBatches` draws batches as
training sees them (the benchmark's confirmation by training).
"""
import os
from typing import Any, Callable, Dict, Iterator, List, Optional

import numpy as np
import torch


def _file_bytes(path: Any) -> int:
    try:
        return os.path.getsize(path) if isinstance(path, str) else 0
    except OSError:
        return 0


def sample_size(info: dict) -> Dict[str, int]:
    """Points (as bytes of the LiDAR files, sweeps included) and boxes of one data info.

    Reads only file sizes and the annotation list, so scanning thousands of infos
    takes seconds. Unknown parts count as 0.
    """
    lidar = info.get('lidar_points') or {}
    points = _file_bytes(lidar.get('lidar_path', info.get('lidar_path')))
    for sweep in info.get('lidar_sweeps') or []:
        points += _file_bytes((sweep.get('lidar_points') or {}).get('lidar_path'))
    if 'instances' in info:
        boxes = len(info['instances'])
    else:
        labels = (info.get('ann_info') or {}).get('gt_labels_3d')
        boxes = 0 if labels is None else len(labels)
    return dict(points=points, boxes=boxes)


def rank_largest(dataset: Any, num: int, scan_limit: int = 1000) -> List[int]:
    """Indices of the ``num`` largest samples among ``scan_limit`` evenly spread ones.

    A sample's size is its share of the largest point file plus its share of the most
    boxes seen in the scan, so both dense clouds and crowded scenes rank high. Datasets
    without ``get_data_info`` fall back to their first samples.
    """
    length = len(dataset)
    if length == 0:
        raise ValueError('auto batch size: the train dataset is empty.')
    scan = np.unique(np.linspace(0, length - 1, min(scan_limit, length)).astype(int))
    if not hasattr(dataset, 'get_data_info'):
        return [int(i) for i in scan[:num]]
    sizes = [sample_size(dataset.get_data_info(int(i))) for i in scan]
    top_points = max(s['points'] for s in sizes) or 1
    top_boxes = max(s['boxes'] for s in sizes) or 1
    score = [s['points'] / top_points + s['boxes'] / top_boxes for s in sizes]
    order = sorted(range(len(scan)), key=lambda k: (-score[k], int(scan[k])))
    return [int(scan[k]) for k in order[:num]]


class LargestSampleBatches:
    """``batches(n)``: a collated batch of the ``n`` largest samples, cycling if needed.

    Each picked sample goes through the dataset's pipeline once and is kept, so larger
    trials reuse what smaller ones loaded.

    Args:
        dataset: the train dataset (an mmdet3d dataset ranks by its data infos).
        collate_fn: the train dataloader's ``collate_fn``.
        num_candidates: distinct samples to use. Defaults to 16.
        scan_limit: infos scanned to find them. Defaults to 1000.
    """

    def __init__(self, dataset: Any, collate_fn: Callable[[list], Any],
                 num_candidates: int = 16, scan_limit: int = 1000):
        if num_candidates < 1 or scan_limit < 1:
            raise ValueError(f'num_candidates and scan_limit must be >= 1, got '
                             f'{num_candidates} and {scan_limit}')
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.indices = rank_largest(dataset, num_candidates, scan_limit)
        self._loaded: Dict[int, Any] = {}

    def _sample(self, idx: int) -> Any:
        if idx not in self._loaded:
            self._loaded[idx] = self.dataset[idx]
        return self._loaded[idx]

    def __call__(self, batch_size: int) -> Any:
        picks = [self.indices[i % len(self.indices)] for i in range(batch_size)]
        return self.collate_fn([self._sample(i) for i in picks])


class RandomSampleBatches:
    """``batches(n)``: a collated batch of ``n`` samples drawn at random (with
    replacement) through the train pipeline, a new draw every call, as training sees
    them. Loaded by a DataLoader with ``num_workers`` processes, rebuilt when ``n``
    changes.

    Args:
        dataset: the train dataset.
        collate_fn: the train dataloader's ``collate_fn``.
        num_workers: loader processes. Defaults to 0 (in this process).
        seed: seed of the draws. Defaults to 0.
    """

    def __init__(self, dataset: Any, collate_fn: Callable[[list], Any],
                 num_workers: int = 0, seed: int = 0):
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.num_workers = int(num_workers)
        self.seed = int(seed)
        self._size: Optional[int] = None
        self._iter: Optional[Iterator] = None

    def __call__(self, batch_size: int) -> Any:
        if batch_size != self._size:
            self._iter = None  # ends the previous loader's workers
            generator = torch.Generator().manual_seed(self.seed + batch_size)
            sampler = torch.utils.data.RandomSampler(
                self.dataset, replacement=True, num_samples=2**31 - 1, generator=generator)
            loader = torch.utils.data.DataLoader(
                self.dataset, batch_size=batch_size, sampler=sampler,
                num_workers=self.num_workers, collate_fn=self.collate_fn)
            self._iter, self._size = iter(loader), batch_size
        return next(self._iter)

    def close(self) -> None:
        """End the loader's worker processes."""
        self._iter, self._size = None, None
