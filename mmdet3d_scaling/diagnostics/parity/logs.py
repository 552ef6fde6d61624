"""Parse what a run leaves: the last checkpoint, the test metrics (and their headline
names), the loss per optimizer step from mmengine's ``vis_data/scalars.json``."""
import json
import os
import os.path as osp
import statistics
from typing import Dict, List

from .errors import ParityError, positive


KITTI_CLASSES = ('Car', 'Pedestrian', 'Cyclist')


def last_checkpoint(work_dir: str) -> str:
    """The checkpoint mmengine's CheckpointHook saved last in ``work_dir``."""
    path = osp.join(work_dir, 'last_checkpoint')
    if not osp.isfile(path):
        raise FileNotFoundError(f'{work_dir} has no last_checkpoint file: the training '
                                'run saved no checkpoint (see train.out there)')
    with open(path) as f:
        return f.read().strip()


def _timestamp_dirs(work_dir: str) -> List[str]:
    """mmengine's per-run log folders (named by timestamp) in ``work_dir``, newest last."""
    if not osp.isdir(work_dir):
        return []
    return sorted(osp.join(work_dir, d) for d in os.listdir(work_dir)
                  if osp.isfile(osp.join(work_dir, d, f'{d}.log')))


def read_test_metrics(test_dir: str) -> Dict[str, float]:
    """Metrics of the newest ``tools/test.py`` run in ``test_dir`` (its ``<ts>.json``)."""
    for log_dir in reversed(_timestamp_dirs(test_dir)):
        path = osp.join(log_dir, osp.basename(log_dir) + '.json')
        if osp.isfile(path):
            with open(path) as f:
                lines = [json.loads(line) for line in f if line.strip()]
            return {k: float(v) for k, v in lines[-1].items()
                    if isinstance(v, (int, float))}
    raise FileNotFoundError(f'no test metrics JSON (<timestamp>/<timestamp>.json) under '
                            f'{test_dir}: did tools/test.py finish? (see test.out)')


def headline_metrics(metrics: Dict[str, float]) -> Dict[str, float]:
    """KITTI AP40 moderate (3D, BEV; overall and per class at the strict IoU) or
    nuScenes mAP / NDS, under short names.

    Raises:
        ParityError: neither kind of metric is among ``metrics``.
    """
    out: Dict[str, float] = {}
    for key, value in metrics.items():
        name = key.rsplit('/', 1)[-1]
        if '/KITTI/' in key:
            for kind in ('3D', 'BEV'):
                if name == f'Overall_{kind}_AP40_moderate':
                    out[f'{kind}_AP40_moderate'] = value
                for cls in KITTI_CLASSES:
                    if name == f'{cls}_{kind}_AP40_moderate_strict':
                        out[f'{cls}_{kind}_AP40_moderate'] = value
        elif name in ('mAP', 'NDS'):
            out[name] = value
    if not out:
        raise ParityError('no KITTI AP40 moderate or nuScenes mAP/NDS among the test '
                          f'metrics: {sorted(metrics)[:12]}')
    return out


def loss_per_step(work_dir: str, accumulation: int) -> List[float]:
    """Mean logged loss per optimizer step (rank 0's micro-batches of each step).

    Reads ``vis_data/scalars.json`` of the newest training log folder; the logger must
    have run every iteration (``default_hooks.logger.interval=1``).
    """
    acc = positive('accumulation', accumulation)
    losses: Dict[int, float] = {}
    for log_dir in _timestamp_dirs(work_dir):
        path = osp.join(log_dir, 'vis_data', 'scalars.json')
        if not osp.isfile(path):
            continue
        with open(path) as f:
            for line in f:
                rec = json.loads(line)
                if 'loss' in rec and 'iter' in rec:
                    losses[int(rec['iter'])] = float(rec['loss'])
    steps: Dict[int, List[float]] = {}
    for it, loss in sorted(losses.items()):
        steps.setdefault((it - 1) // acc, []).append(loss)
    return [round(statistics.fmean(v), 6) for _, v in sorted(steps.items())]
