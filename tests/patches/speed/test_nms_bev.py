"""patches/speed/nms_bev.py: mmdet3d's ``nms_bev`` routed through ``mmdet3d_scaling.ops``.

A real PV-RCNN (the plugin's CPU config) on a real synthetic KITTI batch: the RPN's
training proposals and the predictions (RPN and box-head NMS) are the same with and
without the patch."""
import copy
import os.path as osp
from contextlib import contextmanager

import pytest
import torch
from mmengine.config import Config
from mmengine.runner import Runner

import mmdet3d_scaling  # noqa: F401
from mmdet3d_scaling.patches.speed import nms_bev as patch
from mmdet3d_scaling.patches import patching
from tests.auto_batch_size_common import REPO, _retarget, write_dataset

CONFIG = osp.join(REPO, 'configs', 'pv_rcnn', 'pv_rcnn_synthetic_kitti_cpu.py')


def test_every_binding_is_routed():
    for module in patch.MODULES:
        assert patching.resolve_owner(module).nms_bev is patch.nms_bev, module
    from mmdet3d.models.layers import box3d_nms
    assert patch.nms_bev.original.__module__ == box3d_nms.__name__


@contextmanager
def _upstream():
    """The original nms_bev everywhere, then the patch again."""
    patching.revert(['nms_bev'])
    try:
        assert patching.resolve_owner(patch.MODULES[2]).nms_bev is patch.nms_bev.original
        yield
    finally:
        patching.apply(['nms_bev'])


@pytest.fixture(scope='module')
def runner(tmp_path_factory):
    root = write_dataset(str(tmp_path_factory.mktemp('pv_kitti') / 'synthetic_kitti'),
                         train_frames=2)
    cfg = Config(_retarget(Config.fromfile(CONFIG).to_dict(), root.rstrip('/') + '/'))
    cfg.work_dir = str(tmp_path_factory.mktemp('pv_work'))
    inner = cfg.train_dataloader.dataset.dataset
    inner.pipeline = [t for t in inner.pipeline if t['type'] != 'ObjectSample']
    cfg.model.test_cfg.rcnn.score_thr = 0.  # the untrained box head's NMS sees boxes
    cfg.log_level = 'WARNING'
    return Runner.from_cfg(cfg)


def _assert_same_instances(ours, theirs):
    fields = sorted(theirs.keys())
    assert sorted(ours.keys()) == fields
    for k in fields:
        a, b = getattr(ours, k), getattr(theirs, k)
        a, b = getattr(a, 'tensor', a), getattr(b, 'tensor', b)
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), k


@pytest.mark.slow  # >= 4 s on 2 cores (measured)
def test_pv_rcnn_train_step_same_proposals(runner):
    """The RPN's training proposals (nms_pre 1024, threshold 0.8) from the same
    features; the rest of the step depends on the NMS only through them."""
    model = runner.model
    model.train()
    batch = next(iter(runner.train_dataloader))
    data = model.data_preprocessor(batch, training=True)
    samples = data['data_samples']
    assert len(samples) == 2
    with torch.no_grad():
        feats = model.extract_feat(data['inputs'])

    def proposals():
        return model.rpn_head.loss_and_predict(
            feats, copy.deepcopy(samples), proposal_cfg=model.train_cfg.rpn_proposal)[1]

    ours = proposals()
    with _upstream():
        theirs = proposals()
    for a, b in zip(ours, theirs):
        assert len(b.scores_3d) > 0
        _assert_same_instances(a, b)


@pytest.mark.slow  # >= 4 s on 2 cores (measured)
def test_pv_rcnn_predictions_are_the_same(runner):
    """PV-RCNN's predict, split where the NMS calls are (the CPU backbone is not
    bit-deterministic between calls): RPN proposals, then the box head's results from
    the same point features."""
    model = runner.model
    model.eval()
    batch = next(iter(runner.build_dataloader(runner.cfg.val_dataloader)))
    data = model.data_preprocessor(batch, training=False)
    inputs, samples = data['inputs'], data['data_samples']
    with torch.no_grad():
        feats = model.extract_feat(inputs)
        ours = model.rpn_head.predict(feats, samples)
        with _upstream():
            theirs = model.rpn_head.predict(feats, samples)
        for a, b in zip(ours, theirs):
            assert len(b.scores_3d) > 0
            _assert_same_instances(a, b)
        points = model.extract_points_feat(inputs, feats, theirs)
        ours = model.roi_head.predict(points, theirs, samples)
        with _upstream():
            theirs = model.roi_head.predict(points, theirs, samples)
    assert len(ours) == len(theirs) > 0
    for a, b in zip(ours, theirs):
        assert len(b.scores_3d) > 0
        _assert_same_instances(a, b)
