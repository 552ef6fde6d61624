"""ops/rotated_nms.py: the kept indices of mmcv's ``nms_rotated`` (per group) and of
mmdet3d's ``nms_bev``, compared with the real upstream ops on the same device."""

import pytest
import torch
from mmcv.ops import box_iou_rotated
from mmcv.ops import nms_rotated as mmcv_nms_rotated

from mmdet3d_scaling.ops import nms_bev, nms_rotated

# the module (the package's ``nms_rotated`` is the function)
from mmdet3d_scaling.ops import rotated_nms as module  # noqa: E402

DEVICES = ['cpu', pytest.param('cuda', marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason='needs CUDA'))]
THRESHOLDS = [0.0, 0.1, 0.7]


def _boxes(num: int, seed: int, spread: float = 30., clusters: int = 6,
           ties: bool = False, degenerate: bool = False, thin: bool = False):
    """Boxes around a few cluster centres (many overlaps), and their scores."""
    gen = torch.Generator().manual_seed(seed)
    centres = torch.rand(clusters, 2, generator=gen) * spread
    which = torch.randint(0, clusters, (num,), generator=gen)
    xy = centres[which] + torch.randn(num, 2, generator=gen) * 1.5
    wh = 0.5 + 4 * torch.rand(num, 2, generator=gen)
    yaw = (torch.rand(num, 1, generator=gen) - 0.5) * 6.5
    boxes = torch.cat([xy, wh, yaw], 1)
    if thin:  # shorter sides from 1e-7 to 1 m: where float32 IoU turns to noise
        boxes[:, 3] = 10 ** (-7 * torch.rand(num, generator=gen))
    if degenerate:
        boxes[::7, 2] = 0.  # zero width: area 0, IoU 0
        boxes[1::7, 3] = 1e-8
        boxes[2::7] = boxes[3::7]  # duplicates
    scores = torch.rand(num, generator=gen)
    if ties:
        scores = (scores * 4).round() / 4  # five distinct values
    return boxes, scores


def _reference(boxes, scores, thr, groups=None):
    """mmcv's nms_rotated on each group's boxes (index order), groups ascending."""
    ids = [None] if groups is None else torch.unique(groups).tolist()
    out = []
    for g in ids:
        idx = (torch.arange(len(scores), device=scores.device) if g is None
               else torch.nonzero(groups == g).squeeze(1))
        if len(idx) == 0:
            continue
        keep = mmcv_nms_rotated(boxes[idx], scores[idx], thr)[1]
        out.append(idx[keep])
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long,
                                                  device=boxes.device)


def _assert_same(ours, theirs):
    assert ours.dtype == theirs.dtype == torch.long
    assert ours.device == theirs.device
    assert torch.equal(ours, theirs), (ours.tolist(), theirs.tolist())


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('thr', THRESHOLDS)
@pytest.mark.parametrize('case', [
    dict(num=1), dict(num=2, spread=0.), dict(num=300), dict(num=300, ties=True),
    dict(num=300, degenerate=True), dict(num=300, thin=True),
    dict(num=400, spread=2., clusters=1),
    dict(num=600, spread=80., clusters=40, ties=True, degenerate=True)])
@pytest.mark.parametrize('seed', [0, 1])
def test_same_kept_indices_as_mmcv(device, thr, case, seed):
    boxes, scores = _boxes(seed=seed, **case)
    boxes, scores = boxes.to(device), scores.to(device)
    _assert_same(nms_rotated(boxes, scores, thr), _reference(boxes, scores, thr))


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('thr', THRESHOLDS + [0.5, 1e-7])
@pytest.mark.parametrize('ties', [False, True])
def test_groups_in_one_call(device, thr, ties):
    boxes, scores = _boxes(900, 3, ties=ties, degenerate=True)
    gen = torch.Generator().manual_seed(4)
    groups = torch.randint(0, 9, (900,), generator=gen) * 3  # sparse ids, unsorted
    boxes, scores, groups = boxes.to(device), scores.to(device), groups.to(device)
    ours = nms_rotated(boxes, scores, thr, groups=groups)
    _assert_same(ours, _reference(boxes, scores, thr, groups))


@pytest.mark.parametrize('device', DEVICES)
def test_empty_input(device):
    boxes = torch.zeros(0, 5, device=device)
    scores = torch.zeros(0, device=device)
    for groups in (None, torch.zeros(0, dtype=torch.long, device=device)):
        out = nms_rotated(boxes, scores, 0.5, groups=groups)
        assert out.shape == (0,) and out.dtype == torch.long
        assert out.device == boxes.device
    assert nms_bev(boxes, scores, 0.5, 10, 10).shape == (0,)


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('seed', [5, 6])
def test_iou_exactly_at_the_threshold(device, seed):
    """The threshold is a pair's float32 IoU: CPU suppresses (>=), CUDA does not (>)."""
    boxes, scores = _boxes(200, seed)
    boxes, scores = boxes.to(device), scores.to(device)
    ious = box_iou_rotated(boxes, boxes).triu(1)
    for i, j in torch.nonzero((ious > 0.05) & (ious < 0.95))[:5].tolist():
        at = ious[i, j].item()
        _assert_same(nms_rotated(boxes, scores, at), _reference(boxes, scores, at))


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('pre,post', [(None, None), (100, None), (None, 20), (150, 30),
                                      (5000, 5000), (1, 1)])
@pytest.mark.parametrize('ties', [False, True])
def test_same_as_mmdet3d_nms_bev(device, pre, post, ties):
    from mmdet3d.structures import LiDARInstance3DBoxes, xywhr2xyxyr
    from mmdet3d_scaling.patches.speed.nms_bev import nms_bev as patch
    boxes, scores = _boxes(500, 6, ties=ties)
    xyzwlhr = torch.cat([boxes[:, :2], torch.zeros(500, 1), boxes[:, 2:4],
                         torch.ones(500, 1), boxes[:, 4:]], 1)
    for_nms = xywhr2xyxyr(LiDARInstance3DBoxes(xyzwlhr).bev).to(device)
    scores = scores.to(device)
    for thr in (0.1, 0.8):
        ours = nms_bev(for_nms, scores, thr, pre, post)
        _assert_same(ours, patch.original(for_nms, scores, thr, pre, post))


@pytest.mark.parametrize('device', DEVICES)
def test_nms_bev_groups_cut_each_group(device):
    from mmdet3d_scaling.patches.speed.nms_bev import nms_bev as patch
    boxes, scores = _boxes(600, 7)
    xyxyr = torch.cat([boxes[:, :2] - 1, boxes[:, :2] + boxes[:, 2:4], boxes[:, 4:]], 1)
    groups = torch.arange(600) % 4
    xyxyr, scores, groups = xyxyr.to(device), scores.to(device), groups.to(device)
    ours = nms_bev(xyxyr, scores, 0.3, 90, 12, groups=groups)
    theirs = [torch.nonzero(groups == g).squeeze(1) for g in range(4)]
    theirs = torch.cat([idx[patch.original(xyxyr[idx], scores[idx], 0.3, 90, 12)]
                        for idx in theirs])
    _assert_same(ours, theirs)


def _pairs(search, boxes):
    lo, hi = module._widened_bounds(boxes)
    if search == 'dense':
        return module._dense_pairs(lo, hi, [(0, len(boxes))])
    span = float(hi[:, 0].max() - lo[:, 0].min()) + 1
    return module._swept_pairs(lo, hi, torch.zeros(len(boxes), device=boxes.device),
                               span)


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('search', ['swept', 'dense'])
@pytest.mark.parametrize('degenerate', [False, True])
def test_pairs_left_out_have_an_iou_of_zero(device, search, degenerate):
    """Every pair with a non-zero rotated IoU (mmcv's dense matrix) is a candidate (thin
    boxes too: mmcv's IoU of a near-flat box can be anything), and far fewer pairs than
    all are (the point of the op)."""
    boxes, _ = _boxes(700, 8, spread=60., clusters=30, degenerate=degenerate)
    boxes = boxes.to(device)
    first, second = _pairs(search, boxes)
    assert bool((first < second).all())
    candidate = torch.zeros(700, 700, dtype=torch.bool, device=device)
    candidate[first, second] = True
    ious = box_iou_rotated(boxes, boxes)
    ious = torch.maximum(ious, ious.T).triu(1)  # mmcv's IoU is not symmetric in bits
    assert not bool(((ious != 0) & ~candidate).any())
    if not degenerate:
        assert len(first) < 700 * 699 / 2 / 4


def _greedy_reference(num, src, dst):
    kept, suppressed = [], set()
    by_src = {}
    for a, b in zip(src.tolist(), dst.tolist()):
        by_src.setdefault(a, []).append(b)
    for i in range(num):
        if i in suppressed:
            continue
        kept.append(i)
        suppressed.update(by_src.get(i, ()))
    return kept


@pytest.mark.parametrize('seed', range(4))
def test_greedy_rounds_equal_the_sequential_greedy(seed):
    gen = torch.Generator().manual_seed(seed)
    num = 400
    a = torch.randint(0, num, (3000,), generator=gen)
    b = torch.randint(0, num, (3000,), generator=gen)
    src, dst = torch.minimum(a, b), torch.maximum(a, b)
    src, dst = src[src < dst], dst[src < dst]
    kept = torch.nonzero(module.greedy_keep(num, src, dst)).squeeze(1).tolist()
    assert kept == _greedy_reference(num, src, dst)


def test_chain_needs_one_round_a_link():
    """A chain 0 -> 1 -> 2 ... keeps every other box: the rounds run until done."""
    src = torch.arange(0, 49)
    kept = module.greedy_keep(50, src, src + 1)
    assert torch.nonzero(kept).squeeze(1).tolist() == list(range(0, 50, 2))


@pytest.mark.parametrize('device', DEVICES)
def test_fallbacks_give_upstream_results(device, monkeypatch):
    """Float64 boxes, too many pairs for the budget: mmcv's kernel, same indices."""
    boxes, scores = _boxes(300, 9, spread=3., clusters=1)
    boxes, scores = boxes.to(device), scores.to(device)
    monkeypatch.setattr(module, 'MAX_PAIRS', 10)
    _assert_same(nms_rotated(boxes, scores, 0.3), _reference(boxes, scores, 0.3))
    if device == 'cpu':  # mmcv's CPU kernel takes float64 too
        b64, s64 = boxes.double(), scores.double()
        _assert_same(nms_rotated(b64, s64, 0.3), _reference(b64, s64, 0.3))


def test_bad_input_is_named():
    boxes, scores = _boxes(10, 0)
    with pytest.raises(ValueError, match=r'\(N, 5\)'):
        nms_rotated(boxes[:, :4], scores, 0.5)
    with pytest.raises(ValueError, match='one score a box'):
        nms_rotated(boxes, scores[:5], 0.5)
    with pytest.raises(ValueError, match='integer ids'):
        nms_rotated(boxes, scores, 0.5, groups=scores)
    with pytest.raises(ValueError, match='pre_max_size=-1'):
        nms_bev(boxes, scores, 0.5, pre_max_size=-1)
