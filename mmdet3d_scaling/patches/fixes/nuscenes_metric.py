"""mmdet3d 1.4.0 + nuscenes-devkit 1.x: evaluating a model that detects nothing.

An early or collapsed model can produce no boxes above the score threshold. mmdet3d's
``NuScenesMetric`` still hands the empty result file to the devkit's ``NuScenesEval``,
which fails with "Error: Invalid box type: None" and takes the training run (which
evaluates every epoch) down with it. With no detections every AP is 0 and NDS is 0, so
the patch returns those numbers, with a warning, instead of calling the devkit.
"""
import functools
import json
from typing import List

from mmengine.logging import print_log

from ..patching import Change, Patch, declare

UPSTREAM = ('mmdet3d==1.4.0', 'nuscenes-devkit>=1,<2')


def _count_boxes(result_path: str) -> int:
    with open(result_path) as f:
        results = json.load(f).get('results', {})
    return sum(len(boxes) for boxes in results.values())


def zero_metrics(classes, result_name: str) -> dict:
    """The metrics ``NuScenesMetric`` reports for a result without any box."""
    prefix = f'{result_name}_NuScenes'
    detail = {f'{prefix}/{name}_AP_dist_{d}': 0.0 for name in classes
              for d in ('0.5', '1.0', '2.0', '4.0')}
    detail[f'{prefix}/NDS'] = 0.0
    detail[f'{prefix}/mAP'] = 0.0
    return detail


def _guarded(evaluate_single):
    if getattr(evaluate_single, '_mmdet3d_scaling_guarded', False):
        return evaluate_single

    @functools.wraps(evaluate_single)
    def wrapper(self, result_path, classes=None, result_name='pred_instances_3d'):
        if _count_boxes(result_path) == 0:
            print_log(f'NuScenesMetric: {result_path} holds no detections; reporting '
                      'mAP = NDS = 0 without running the nuScenes evaluation (which '
                      'fails on an empty result).', logger='current', level=30)
            return zero_metrics(classes or [], result_name)
        return evaluate_single(self, result_path, classes, result_name)

    wrapper._mmdet3d_scaling_guarded = True
    return wrapper


def _changes() -> List[Change]:
    from mmdet3d.evaluation.metrics.nuscenes_metric import NuScenesMetric
    return [Change(NuScenesMetric, '_evaluate_single',
                   _guarded(NuScenesMetric._evaluate_single))]


PATCH = declare(Patch(
    name='nuscenes_metric', kind='fixes',
    targets=('mmdet3d.evaluation.metrics.nuscenes_metric.NuScenesMetric._evaluate_single',),
    upstream=UPSTREAM, changes=_changes,
    why='a result without boxes crashes the devkit (and the training run that '
        'evaluates): report mAP = NDS = 0 instead'))
