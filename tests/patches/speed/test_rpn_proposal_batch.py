"""patches/speed/rpn_proposal_batch.py: one grouped NMS for the batch, the same proposals.

The head is PV-RCNN's own RPN head (``tests/pv_rcnn_heads.py``); the reference is
mmdet3d's ``predict_by_feat`` with this patch reverted (its loop over samples, with the
``rpn_proposal_nms`` patch, itself tested against mmdet3d's code)."""
import contextlib

import pytest
import torch
from mmengine.config import ConfigDict

from mmdet3d_scaling.patches.speed import rpn_proposal_batch as patch
from tests.pv_rcnn_heads import build_pv_rcnn_head

from ..reverting import reverted

DEVICES = ['cpu'] + (['cuda'] if torch.cuda.is_available() else [])


@pytest.fixture(scope='module')
def head():
    return build_pv_rcnn_head('rpn_head', 'rpn')


def _loop():
    """mmdet3d's loop over samples (this patch reverted)."""
    return reverted(['rpn_proposal_batch'])


def _predictions(batch: int, size, seed: int, device: str, low: int = -1):
    """Random RPN outputs of a square feature map (``size``) or (height, width)."""
    height, width = (size, size) if isinstance(size, int) else size
    gen = torch.Generator().manual_seed(seed)
    anchors = 6  # 3 sizes x 2 rotations a location
    cls = torch.randn(batch, anchors * 3, height, width, generator=gen)
    if low >= 0:  # one sample whose every score is below 0.5
        cls[low] = -5.0
    box = 0.3 * torch.randn(batch, anchors * 7, height, width, generator=gen)
    direction = torch.randn(batch, anchors * 2, height, width, generator=gen)
    return [cls.to(device)], [box.to(device)], [direction.to(device)]


def _metas(batch):
    from mmdet3d.structures import LiDARInstance3DBoxes
    return [dict(box_type_3d=LiDARInstance3DBoxes) for _ in range(batch)]


def _same(ours, theirs):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert type(a.bboxes_3d) is type(b.bboxes_3d)
        for x, y in [(a.bboxes_3d.tensor, b.bboxes_3d.tensor)] + [
                (getattr(a, k), getattr(b, k))
                for k in ('scores_3d', 'labels_3d', 'cls_preds')]:
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('cfg', [
    dict(nms_pre=1024, nms_post=64, nms_thr=0.8, score_thr=0, use_rotate_nms=True),
    dict(nms_pre=9000, nms_post=512, nms_thr=0.7, score_thr=0.3, use_rotate_nms=True),
    dict(nms_pre=100, nms_post=2000, nms_thr=0.1, score_thr=0, use_rotate_nms=True)])
@pytest.mark.parametrize('seed', [0, 1])
def test_batched_proposals_equal_the_loops(head, cfg, seed, device, monkeypatch):
    head = head.to(device)
    calls = []
    real = patch.nms_of_the_batch
    monkeypatch.setattr(patch, 'nms_of_the_batch',
                        lambda h, c: calls.append(len(c)) or real(h, c))
    preds, metas, cfg = _predictions(4, 20, seed, device), _metas(4), ConfigDict(cfg)
    with _loop():
        theirs = head.predict_by_feat(*preds, batch_input_metas=metas, cfg=cfg)
    ours = head.predict_by_feat(*preds, batch_input_metas=metas, cfg=cfg)
    assert calls == [4]
    _same(ours, theirs)
    assert ours[0].bboxes_3d.tensor.device.type == device
    assert 'class_agnostic_nms' not in vars(head)


@pytest.mark.parametrize('device', DEVICES)
def test_the_batch_is_decoded_at_once(head, device, monkeypatch):
    decoded = []
    real = patch.decode_the_batch
    monkeypatch.setattr(patch, 'decode_the_batch',
                        lambda h, *a: decoded.append(len(a[-2])) or real(h, *a))
    head = head.to(device)
    cfg = ConfigDict(nms_pre=500, nms_post=64, nms_thr=0.8, score_thr=0,
                     use_rotate_nms=True)
    head.predict_by_feat(*_predictions(3, 12, 0, device), batch_input_metas=_metas(3),
                         cfg=cfg)
    assert decoded == [3]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='a full-size batch: CUDA')
@pytest.mark.parametrize('seed', [0, 1])
def test_a_pv_rcnn_batch_of_8_equals_the_loop_on_the_gpu(head, seed):
    """PV-RCNN's training shapes: 8 samples, a 200 x 176 map, nms_pre 9000 of 211,200
    anchors (the kernels of top-k and max may change with the size; the result not)."""
    head = head.to('cuda')
    preds, metas = _predictions(8, (200, 176), seed, 'cuda'), _metas(8)
    cfg = ConfigDict(nms_pre=9000, nms_post=512, nms_thr=0.8, score_thr=0,
                     use_rotate_nms=True)
    with _loop():
        theirs = head.predict_by_feat(*preds, batch_input_metas=metas, cfg=cfg)
    _same(head.predict_by_feat(*preds, batch_input_metas=metas, cfg=cfg), theirs)


def test_softmax_scores_are_decoded_sample_by_sample_then_grouped(head, monkeypatch):
    """A head the batched decoding does not take (softmax scores): mmdet3d decodes each
    sample, the NMS still runs once for the batch."""
    decoded, grouped = [], []
    monkeypatch.setattr(patch, 'decode_the_batch', lambda *a: decoded.append(1))
    real = patch.nms_of_the_batch
    monkeypatch.setattr(patch, 'nms_of_the_batch',
                        lambda h, c: grouped.append(len(c)) or real(h, c))
    monkeypatch.setattr(head, 'use_sigmoid_cls', False)
    preds, metas = _predictions(3, 12, 0, 'cpu'), _metas(3)
    cfg = ConfigDict(nms_pre=500, nms_post=64, nms_thr=0.8, score_thr=0,
                     use_rotate_nms=True)
    with _loop():
        theirs = head.predict_by_feat(*preds, batch_input_metas=metas, cfg=cfg)
    _same(head.predict_by_feat(*preds, batch_input_metas=metas, cfg=cfg), theirs)
    assert decoded == [] and grouped == [3]


def test_what_the_batch_does_not_take_runs_sample_by_sample(head):
    metas = _metas(3)
    for preds, cfg in [
            (_predictions(3, 12, 0, 'cpu', low=1),  # a sample with no box above 0.5
             dict(nms_pre=500, nms_post=64, nms_thr=0.8, score_thr=0.5, use_rotate_nms=True)),
            (_predictions(3, 12, 1, 'cpu'),  # axis-aligned NMS
             dict(nms_pre=500, nms_post=64, nms_thr=0.8, score_thr=0, use_rotate_nms=False))]:
        cfg = ConfigDict(cfg)
        with _loop():
            theirs = head.predict_by_feat(*preds, batch_input_metas=metas, cfg=cfg)
        _same(head.predict_by_feat(*preds, batch_input_metas=metas, cfg=cfg), theirs)
    assert len(theirs[1].scores_3d) > 0


def test_a_subclass_with_its_own_nms_keeps_it(head):
    class OwnNMS(type(head)):
        def class_agnostic_nms(self, *args):
            return 'own'

    head.__class__ = OwnNMS
    try:
        assert not patch._own_code(head)
        out = head.predict_by_feat(*_predictions(2, 8, 0, 'cpu'),
                                   batch_input_metas=_metas(2),
                                   cfg=ConfigDict(nms_pre=50, nms_post=8, nms_thr=0.8,
                                                  score_thr=0, use_rotate_nms=True))
        assert out == ['own', 'own']
    finally:
        head.__class__ = OwnNMS.__mro__[1]


def test_fewer_host_reads_than_the_loop(head):
    from mmdet3d_scaling.diagnostics.host_reads import HostReadCensus
    preds, metas = _predictions(8, 16, 0, 'cpu'), _metas(8)
    cfg = ConfigDict(nms_pre=1024, nms_post=64, nms_thr=0.8, score_thr=0,
                     use_rotate_nms=True)
    counts = []
    for batched in (True, False):
        with contextlib.ExitStack() as stack:
            if not batched:
                stack.enter_context(_loop())
            with HostReadCensus() as census:
                head.predict_by_feat(*preds, batch_input_metas=metas, cfg=cfg)
        counts.append(census.total)
    ours, theirs = counts
    assert ours < theirs / 2, (ours, theirs)
