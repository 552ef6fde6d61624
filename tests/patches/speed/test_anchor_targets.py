"""patches/speed/anchor_targets.py: the anchor head's per-class targets for the whole batch,
every target, count and loss as upstream, one host read a batch.

The head is PV-RCNN's own RPN head (PartA2RPNHead: three per-class Max3DIoUAssigners
with the nearest-BEV IoU, the pseudo sampler, focal loss) built from the plugin's
PV-RCNN config; ground truths are jittered copies of the head's own anchors (so every
class gets positives at several IoUs, and low-quality matches) and random boxes."""
import copy

import pytest
import torch
from mmengine.structures import InstanceData

import mmdet3d_scaling  # noqa: F401  (applies the patches)
from mmdet3d_scaling.patches.speed import anchor_targets as patch
from mmdet3d_scaling.patches import patching
from mmdet3d_scaling.diagnostics.host_reads import HostReadCensus
from tests.devices import DEVICES
from tests.pv_rcnn_heads import build_pv_rcnn_head

ORIGINAL = patch.anchor_target_3d.original
FEATMAP = (20, 22)  # a coarse grid over the KITTI range: quick, same anchor layout


@pytest.fixture(scope='module')
def head():
    return build_pv_rcnn_head('rpn_head', 'rpn')


def _anchors(head, batch, device):
    return head.get_anchors([FEATMAP], [{}] * batch, device=device)


def _gts(head, labels, num_random, seed, device):
    """Boxes near anchors of their class (positives, low-quality matches, a repeated
    box for ties) and random boxes of any class."""
    from mmdet3d.structures import LiDARInstance3DBoxes
    gen = torch.Generator().manual_seed(seed)
    anchors = _anchors(head, 1, 'cpu')[0][0]  # (1, H, W, classes, rotations, 7)
    boxes = []
    for cls in labels:
        per_class = anchors[..., cls, :, :].reshape(-1, 7)
        box = per_class[torch.randint(len(per_class), (1, ), generator=gen)][0].clone()
        box[:3] += 0.1 * torch.randn(3, generator=gen)
        box[3:6] *= 1 + 0.1 * torch.randn(3, generator=gen)
        box[6] += 0.3 * torch.randn(1, generator=gen)[0]
        boxes.append(box)
    if len(labels) > 1:  # the last box repeats the first: a tie for the best anchor
        boxes[-1], labels = boxes[0].clone(), list(labels[:-1]) + [labels[0]]
    rand = torch.cat([torch.rand(num_random, 3, generator=gen) * torch.tensor([70., 80., 2.])
                      - torch.tensor([0., 40., 2.]),
                      1 + 3 * torch.rand(num_random, 3, generator=gen),
                      6.2 * torch.rand(num_random, 1, generator=gen) - 3.1], 1)
    tensor = torch.cat([torch.stack(boxes) if boxes else torch.zeros(0, 7), rand])
    all_labels = torch.tensor(list(labels) + torch.randint(
        0, 3, (num_random, ), generator=gen).tolist(), dtype=torch.long)
    return InstanceData(bboxes_3d=LiDARInstance3DBoxes(tensor.to(device)),
                        labels_3d=all_labels.to(device))


def _batch(head, seed, device):
    return [_gts(head, [0, 1, 2, 2, 0, 1, 2], 6, seed, device),
            _gts(head, [], 0, seed + 1, device),            # no ground truth at all
            _gts(head, [2, 2, 2], 0, seed + 2, device),     # one class only
            _gts(head, [1, 0], 3, seed + 3, device)]


def _targets(fn, head, gts, device):
    return fn(head, _anchors(head, len(gts), device), copy.deepcopy(gts),
              [{}] * len(gts), num_classes=head.num_classes, sampling=head.sampling)


def _assert_same(ours, theirs):
    assert len(ours) == len(theirs) == 8
    for name, a, b in zip(['labels', 'label_weights', 'bbox_targets', 'bbox_weights',
                           'dir_targets', 'dir_weights'], ours[:6], theirs[:6]):
        assert len(a) == len(b), name
        for x, y in zip(a, b):
            assert x.dtype == y.dtype and x.shape == y.shape, name
            if name == 'bbox_targets':  # encoded on all anchors vs the positives only:
                torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)  # CPU SIMD ulps
            else:
                assert torch.equal(x, y), name
    assert ours[6:] == theirs[6:]  # num_total_pos, num_total_neg


def test_the_patch_is_in_place():
    from mmdet3d.models.dense_heads.train_mixins import AnchorTrainMixin
    assert AnchorTrainMixin.anchor_target_3d is patch.anchor_target_3d
    assert patching.apply(['anchor_targets']) == []  # applied once; the original stays
    assert patch.anchor_target_3d.original is ORIGINAL


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('seed', [0, 1])
def test_same_targets_as_mmdet3d(head, seed, device):
    gts = _batch(head, seed, device)
    ours, theirs = (_targets(fn, head, gts, device) for fn in (patch.anchor_target_3d,
                                                               ORIGINAL))
    _assert_same(ours, theirs)
    labels = theirs[0][0]
    for cls in range(3):  # every class has positives, the empty samples none
        assert (labels == cls).any()
    assert (labels[1] == head.num_classes).all()


def test_a_batch_without_ground_truths(head):
    gts = [_gts(head, [], 0, seed, 'cpu') for seed in range(2)]
    ours, theirs = (_targets(fn, head, gts, 'cpu') for fn in (patch.anchor_target_3d,
                                                              ORIGINAL))
    _assert_same(ours, theirs)
    assert ours[6] == 2  # max(0, 1) a sample


@pytest.mark.parametrize('low_quality', ['assign_all', 'argmax_only', 'off'])
def test_same_targets_with_other_assigner_rules(head, low_quality):
    """gt_max_assign_all off, low-quality matching off, tuple neg_iou_thr."""
    head = copy.deepcopy(head)
    for assigner in head.bbox_assigner:
        assigner.gt_max_assign_all = low_quality == 'assign_all'
        assigner.match_low_quality = low_quality != 'off'
        assigner.neg_iou_thr = (0.05, assigner.neg_iou_thr)
    gts = _batch(head, 5, 'cpu')
    _assert_same(_targets(patch.anchor_target_3d, head, gts, 'cpu'),
                 _targets(ORIGINAL, head, gts, 'cpu'))


def test_assigners_that_see_every_class(head):
    """assign_per_class off (SECOND's recipe): each class's anchors against all ground
    truths, labels from the matched one; the same targets, and upstream's side effect
    (box tensors in place of the boxes of non-empty samples)."""
    head = copy.deepcopy(head)
    head.assign_per_class = False
    gts = _batch(head, 0, 'cpu')
    ours_gts, their_gts = copy.deepcopy(gts), copy.deepcopy(gts)
    args = ([{}] * len(gts), )
    kwargs = dict(num_classes=head.num_classes, sampling=head.sampling)
    ours = patch.anchor_target_3d(head, _anchors(head, len(gts), 'cpu'), ours_gts, *args,
                                 **kwargs)
    theirs = ORIGINAL(head, _anchors(head, len(gts), 'cpu'), their_gts, *args, **kwargs)
    _assert_same(ours, theirs)
    for a, b in zip(ours_gts, their_gts):
        assert type(a.bboxes_3d) is type(b.bboxes_3d)
        assert torch.equal(_box(a), _box(b))
    assert {type(g.bboxes_3d) for g in their_gts} == {torch.Tensor, type(gts[0].bboxes_3d)}


def _box(gt):
    return gt.bboxes_3d if isinstance(gt.bboxes_3d, torch.Tensor) else gt.bboxes_3d.tensor


def test_other_heads_go_to_the_original(head):
    """A single assigner for all anchors: the original computes it (its reads show)."""
    head = copy.deepcopy(head)
    head.bbox_assigner = head.bbox_assigner[0]
    gts = _batch(head, 0, 'cpu')
    with HostReadCensus() as census:
        ours = _targets(patch.anchor_target_3d, head, gts, 'cpu')
    _assert_same(ours, _targets(ORIGINAL, head, gts, 'cpu'))
    assert census.total > 1


@pytest.mark.parametrize('device', DEVICES)
def test_same_losses_as_mmdet3d(head, device, monkeypatch):
    from mmdet3d.models.dense_heads.train_mixins import AnchorTrainMixin
    head = copy.deepcopy(head).to(device)
    gts = _batch(head, 3, device)
    gen = torch.Generator().manual_seed(0)
    anchors_per_cell = head.prior_generator.num_base_anchors
    preds = [[torch.randn(len(gts), anchors_per_cell * c, *FEATMAP,
                          generator=gen).to(device)]
             for c in (head.num_classes, 7, 2)]
    ours = head.loss_by_feat(*preds, copy.deepcopy(gts), [{}] * len(gts))
    monkeypatch.setattr(AnchorTrainMixin, 'anchor_target_3d', ORIGINAL)
    theirs = head.loss_by_feat(*preds, copy.deepcopy(gts), [{}] * len(gts))
    assert ours.keys() == theirs.keys()
    for key in theirs:
        torch.testing.assert_close(ours[key], theirs[key], rtol=1e-5, atol=1e-7)


def test_one_read_a_batch(head):
    gts = _batch(head, 0, 'cpu')
    censuses = []
    for fn in (patch.anchor_target_3d, ORIGINAL):
        with HostReadCensus() as census:
            _targets(fn, head, gts, 'cpu')
        censuses.append(census)
    ours, theirs = censuses
    assert ours.total == 1
    assert theirs.total >= 2 * 3 * len(gts)  # two class masks a sample and class


def test_large_batches_go_in_chunks(head, monkeypatch):
    """Above MAX_PAIRS (ground truth, anchor) pairs a class the batch is assigned a few
    samples at a time: the same targets."""
    from mmdet3d_scaling.patches.speed import _batched_assign
    gts = _batch(head, 0, 'cpu')
    theirs = _targets(ORIGINAL, head, gts, 'cpu')
    # padded ground truths x one class's anchors (2 rotations a cell)
    per_sample = max(len(g.labels_3d) for g in gts) * FEATMAP[0] * FEATMAP[1] * 2
    assert _batched_assign.sample_chunks(len(gts), per_sample)[0] == slice(0, len(gts))
    monkeypatch.setattr(_batched_assign, 'MAX_PAIRS', 2 * per_sample)
    assert len(_batched_assign.sample_chunks(len(gts), per_sample)) == 2
    _assert_same(_targets(patch.anchor_target_3d, head, gts, 'cpu'), theirs)


@pytest.mark.parametrize('config', ['configs/pointpillars/pointpillars_synthetic_kitti.py',
                                    'configs/second/second_synthetic_kitti.py'])
def test_the_batched_path_serves_second_and_pointpillars(config):
    """The plugin's SECOND and PointPillars configs (per-class anchors and assigners)
    take the batched path: the same targets, one host read."""
    from mmdet3d.registry import MODELS
    from mmdet3d.utils import register_all_modules
    from mmengine.config import Config
    register_all_modules()
    model = Config.fromfile(config).model
    head = MODELS.build(dict(model.bbox_head, train_cfg=model.train_cfg,
                             test_cfg=model.test_cfg))
    gts = _batch(head, 2, 'cpu')
    with HostReadCensus() as census:
        ours = _targets(patch.anchor_target_3d, head, gts, 'cpu')
    assert census.total == 1
    _assert_same(ours, _targets(ORIGINAL, head, gts, 'cpu'))
