"""NuScenesMetric (with the ``nuscenes_metric`` fix) scores boxes on synthetic nuScenes.

The ground truth of the generated val split, handed to mmdet3d's own ``NuScenesMetric``
as a detector's output would be (``LiDARInstance3DBoxes`` bottom-centred in the LiDAR
frame, 9 values with velocity, labels in the config's class order, score 1.0), must
score mAP 1: the generator's tables (boxes, ego poses, categories, velocities) agree
with its info files, and the metric's LiDAR -> global conversion finds every box. Wrong boxes must score less, or the check could not fail.
"""
import os.path as osp
import pickle

import numpy as np
import pytest
import torch

from mmdet3d_scaling.datasets.synthetic.nuscenes import (NuScenesSyntheticConfig,
                                                         generate_nuscenes)

#: mmdet3d's nuScenes class order (the BEVFusion configs' ``class_names``); the info
#: files list the categories in another order, so labels must go through the names.
CONFIG_CLASSES = ('car', 'truck', 'construction_vehicle', 'bus', 'trailer', 'barrier',
                  'motorcycle', 'bicycle', 'pedestrian', 'traffic_cone')


@pytest.fixture(scope='module')
def root(tmp_path_factory):
    out = tmp_path_factory.mktemp('nus_metric')
    generate_nuscenes(NuScenesSyntheticConfig(
        out_dir=str(out), train_frames=1, val_frames=12, samples_per_scene=6, sweeps=0,
        image_size=(64, 176), objects_per_sample=16, clutter_per_sample=4,
        gt_database=False), progress=False)
    return str(out)


@pytest.fixture(scope='module')
def val_infos(root):
    with open(osp.join(root, 'nuscenes_infos_val.pkl'), 'rb') as f:
        return pickle.load(f)


def build_metric(root: str, jsonfile_prefix: str):
    """The evaluator a config's ``val_evaluator`` builds, with the dataset's metainfo
    (config class order) as the Runner hands it over."""
    from mmdet3d.datasets import NuScenesDataset
    from mmdet3d.registry import METRICS
    from mmengine.registry import init_default_scope

    import mmdet3d_scaling  # noqa: F401  (applies the compat fixes)
    init_default_scope('mmdet3d')
    dataset = NuScenesDataset(
        data_root=root, ann_file='nuscenes_infos_val.pkl', pipeline=[], test_mode=True,
        data_prefix=dict(pts='samples/LIDAR_TOP', sweeps='sweeps/LIDAR_TOP'),
        metainfo=dict(classes=CONFIG_CLASSES), modality=dict(use_lidar=True))
    evaluator = METRICS.build(dict(
        type='NuScenesMetric', data_root=root, metric='bbox',
        ann_file=osp.join(root, 'nuscenes_infos_val.pkl'), jsonfile_prefix=jsonfile_prefix))
    evaluator.dataset_meta = dataset.metainfo
    return evaluator


@pytest.fixture
def metric(root, tmp_path):
    return build_metric(root, str(tmp_path / 'results'))


def _as_predictions(val_infos, shift=(0.0, 0.0), d_yaw=0.0, classes=CONFIG_CLASSES):
    """Each val sample's valid GT boxes as a detector's ``pred_instances_3d``.

    Args:
        shift: metres added to every box's LiDAR-frame x, y. Defaults to no shift.
        d_yaw: radians added to every yaw. Defaults to 0.
        classes: class order the labels index (a wrong order mislabels the boxes).
    """
    from mmdet3d.structures import LiDARInstance3DBoxes
    names = list(val_infos['metainfo']['categories'])
    results = []
    for info in val_infos['data_list']:
        valid = [inst for inst in info['instances'] if inst['bbox_3d_isvalid']]
        boxes = np.array([[*inst['bbox_3d'], *inst['velocity']] for inst in valid],
                         np.float32).reshape(-1, 9)
        boxes[:, 2] -= boxes[:, 5] / 2  # infos: gravity centre; boxes: bottom centre
        boxes[:, :2] += shift
        boxes[:, 6] += d_yaw
        labels = [classes.index(names[inst['bbox_label_3d']]) for inst in valid]
        results.append(dict(
            pred_instances_3d=dict(
                bboxes_3d=LiDARInstance3DBoxes(torch.from_numpy(boxes), box_dim=9),
                scores_3d=torch.ones(len(boxes)),
                labels_3d=torch.tensor(labels, dtype=torch.long)),
            pred_instances=dict(), sample_idx=info['sample_idx']))
    return results


def _score(metric, predictions) -> dict:
    out = metric.compute_metrics(predictions)
    return {key.split('/')[-1]: value for key, value in out.items()}


def test_ground_truth_scores_map_one(metric, val_infos):
    n_boxes = sum(inst['bbox_3d_isvalid'] for info in val_infos['data_list']
                  for inst in info['instances'])
    assert n_boxes > 100
    scores = _score(metric, _as_predictions(val_infos))
    assert scores['mAP'] > 0.99
    for name in CONFIG_CLASSES:  # every class is present and found
        assert scores[f'{name}_AP_dist_0.5'] > 0.98, name
    assert scores['mATE'] < 1e-3 and scores['mASE'] < 1e-3 and scores['mAOE'] < 1e-3
    assert scores['mAVE'] < 1e-2
    # the metric infers attributes from speed and class; the generator draws them
    # (a standing vehicle is 'parked' or 'stopped'), so mAAE is not 0 and NDS is
    # 1 - mAAE / 10
    assert scores['NDS'] == pytest.approx(1 - scores['mAAE'] / 10, abs=1e-3)
    assert scores['NDS'] > 0.9


def test_wrong_yaw_raises_orientation_error_only(metric, val_infos):
    # nuScenes matches by centre distance: a wrong yaw keeps mAP, costs mAOE and NDS
    scores = _score(metric, _as_predictions(val_infos, d_yaw=np.pi / 2))
    assert scores['mAP'] > 0.99
    assert abs(scores['mAOE'] - np.pi / 2) < 0.05
    assert scores['NDS'] < 0.93


def test_shifted_boxes_lower_map(metric, val_infos):
    # 1.5 m off: matched at the 2 m and 4 m thresholds only -> AP about 0.5
    half = _score(metric, _as_predictions(val_infos, shift=(1.5, 0.0)))
    assert 0.4 < half['mAP'] < 0.6
    assert abs(half['mATE'] - 1.5) < 0.01
    none = _score(metric, _as_predictions(val_infos, shift=(0.0, 6.0)))
    assert none['mAP'] < 0.05


def test_labels_in_info_order_are_mislabelled(metric, val_infos):
    # the info files' category order is not the config's: indexing the wrong one
    # scores only the classes that sit at the same index in both (car, truck)
    info_order = tuple(val_infos['metainfo']['categories'])
    assert info_order != CONFIG_CLASSES
    scores = _score(metric, _as_predictions(val_infos, classes=info_order))
    same = sum(a == b for a, b in zip(info_order, CONFIG_CLASSES))
    assert scores['mAP'] < (same + 0.5) / len(CONFIG_CLASSES)


def main() -> None:
    """Print the ground-truth check on a generated data root as JSON::

        python -m tests.patches.fixes.test_nuscenes_metric data/synthetic_nuscenes
    """
    import json
    import sys
    import tempfile
    root = sys.argv[1]
    with open(osp.join(root, 'nuscenes_infos_val.pkl'), 'rb') as f:
        infos = pickle.load(f)
    cases = dict(ground_truth={}, yaw_plus_90deg=dict(d_yaw=np.pi / 2),
                 shifted_1_5m=dict(shift=(1.5, 0.0)))
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        metric = build_metric(root, tmp)
        for name, kwargs in cases.items():
            scores = _score(metric, _as_predictions(infos, **kwargs))
            out[name] = {key: round(scores[key], 4) for key in
                         ('mAP', 'NDS', 'mATE', 'mASE', 'mAOE', 'mAVE', 'mAAE')}
    print(json.dumps(out, indent=1))


if __name__ == '__main__':
    main()
