"""TransFusion head: box coder, assigners, decoder layer, forward / loss / predict."""
import numpy as np
import pytest
import torch

from mmdet3d.registry import MODELS, TASK_UTILS
from mmdet3d.structures import LiDARInstance3DBoxes

from .common import GRID, OSF, PCR, VOXEL, build, gt_of, tiny_head_cfg, toy_batch

BEV = (GRID[0] // OSF, GRID[1] // OSF)


def _coder(code_size=10, **kwargs):
    return TASK_UTILS.build(dict(type='TransFusionBBoxCoder', pc_range=PCR[:2],
                                 out_size_factor=OSF, voxel_size=VOXEL[:2],
                                 code_size=code_size, **kwargs))


def _decode_targets(coder, targets):
    t = targets.T[None]  # [1, code, N]
    vel = t[:, 8:10] if coder.code_size == 10 else None
    heat = torch.rand(1, 3, t.shape[-1])
    return coder.decode(heat, t[:, 6:8], t[:, 3:6], t[:, 0:2], t[:, 2:3], vel)[0]


@pytest.mark.parametrize('code_size', [8, 10])
def test_bbox_coder_round_trip(code_size):
    coder = _coder(code_size)
    boxes = torch.tensor([[1.0, -2.0, -1.5, 4.0, 1.8, 1.6, 0.3, 1.0, -0.5],
                          [-7.0, 5.0, -1.0, 0.7, 0.6, 1.7, -2.9, 0.0, 0.2]])
    targets = coder.encode(boxes)
    assert targets.shape == (2, code_size)
    # x in feature cells, z of the gravity centre
    assert targets[0, 0] == pytest.approx((1.0 - PCR[0]) / (OSF * VOXEL[0]))
    assert targets[0, 2] == pytest.approx(-1.5 + 0.8)
    decoded = _decode_targets(coder, targets.clone())['bboxes']
    np.testing.assert_allclose(decoded.numpy(), boxes[:, :decoded.shape[1]].numpy(),
                               atol=1e-5)
    assert torch.equal(targets, coder.encode(boxes))  # decode did not touch its inputs


def test_bbox_coder_filters():
    coder = _coder(post_center_range=[-5, -5, -10, 5, 5, 10], score_threshold=0.5)
    boxes = torch.tensor([[1.0, 1.0, -1.0, 2, 2, 2, 0, 0, 0],
                          [9.0, 1.0, -1.0, 2, 2, 2, 0, 0, 0],
                          [1.0, 2.0, -1.0, 2, 2, 2, 0, 0, 0]])
    t = coder.encode(boxes).T[None]
    heat = torch.tensor([[[0.9, 0.9, 0.2]]])
    out = coder.decode(heat, t[:, 6:8], t[:, 3:6], t[:, 0:2], t[:, 2:3], t[:, 8:10],
                       filter=True)[0]
    assert len(out['bboxes']) == 1 and out['scores'].item() == pytest.approx(0.9)
    with pytest.raises(ValueError, match='code_size'):
        _coder(code_size=9)


def _boxes(rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_hungarian_assigner_matches_nearest_and_handles_no_gt():
    assigner = TASK_UTILS.build(tiny_head_cfg()['train_cfg']['assigner'])
    gt = _boxes([[0, 0, -1, 4, 2, 1.5, 0, 0, 0], [6, 6, -1, 1, 1, 1.5, 0, 0, 0]])
    labels = torch.tensor([0, 8])
    preds = _boxes([[6.2, 6.1, -1, 1, 1, 1.5, 0, 0, 0], [30, 30, -1, 1, 1, 1, 0, 0, 0],
                    [0.1, -0.2, -1, 4, 2, 1.5, 0.1, 0, 0]])
    logits = torch.full((1, 10, 3), -3.0)
    cfg = tiny_head_cfg()['train_cfg']
    result = assigner.assign(preds, gt, labels, logits, cfg)
    assert result.gt_inds.tolist() == [2, 0, 1]
    assert result.labels.tolist() == [8, -1, 0]
    assert result.max_overlaps[2] > 0.7 and result.max_overlaps[1] == 0

    empty = assigner.assign(preds, gt[:0], labels[:0], logits, cfg)
    assert empty.gt_inds.tolist() == [0, 0, 0] and empty.max_overlaps.shape == (3, )


def test_heuristic_assigner_and_costs():
    assigner = TASK_UTILS.build(dict(type='HeuristicAssigner3D', dist_thre=3.0))
    gt = _boxes([[0, 0, -1, 4, 2, 1.5, 0], [10, 0, -1, 4, 2, 1.5, 0]])
    preds = _boxes([[0.5, 0, -1, 4, 2, 1.5, 0], [20, 0, -1, 4, 2, 1.5, 0]])
    result = assigner.assign(preds, gt, None, torch.tensor([0, 0]), torch.tensor([0, 0]))
    assert result.gt_inds.tolist() == [1, 0]  # the second gt is 10 m from any proposal
    same_class_only = assigner.assign(preds, gt, None, torch.tensor([3, 0]),
                                      torch.tensor([0, 0]))
    assert same_class_only.gt_inds.tolist() == [0, 0]

    l1 = TASK_UTILS.build(dict(type='BBoxBEVL1Cost', weight=0.5))
    cost = l1(preds, gt, dict(point_cloud_range=[-10, -10, -5, 10, 10, 3]))
    assert cost[0, 0].item() == pytest.approx(0.5 * 0.5 / 20)
    iou_cost = TASK_UTILS.build(dict(type='IoU3DCost', weight=2.0))
    assert iou_cost(torch.tensor([0.5])).item() == -1.0


def test_decoder_layer_shapes_and_gradients():
    layer = MODELS.build(tiny_head_cfg()['decoder_layer'])
    query = torch.randn(2, 32, 7, requires_grad=True)
    key = torch.randn(2, 32, 30)
    out = layer(query, key=key, query_pos=torch.rand(2, 7, 2), key_pos=torch.rand(2, 30, 2))
    assert out.shape == (2, 32, 7)
    out.sum().backward()
    missing = [n for n, p in layer.named_parameters() if p.grad is None]
    assert not missing, missing


def _head(**kwargs):
    head = build(tiny_head_cfg(in_channels=16, **kwargs))
    head.train()
    return head


def test_forward_shapes():
    head = _head(num_decoder_layers=2)
    feats = torch.randn(2, 16, *BEV)
    preds = head(feats, [{}, {}])[0][0]
    p = 20 * 2  # proposals x supervised layers
    assert preds['center'].shape == (2, 2, p)
    assert preds['height'].shape == (2, 1, p)
    assert preds['dim'].shape == (2, 3, p) and preds['rot'].shape == (2, 2, p)
    assert preds['vel'].shape == (2, 2, p) and preds['heatmap'].shape == (2, 10, p)
    assert preds['query_heatmap_score'].shape == (2, 10, 20)
    assert preds['query_labels'].shape == (2, 20)
    assert preds['dense_heatmap'].shape == (2, 10, *BEV)
    # proposals start at distinct BEV cells, at cell centres
    assert head.bev_pos.shape == (1, BEV[0] * BEV[1], 2)
    with pytest.raises(ValueError, match='grid_size'):
        head(torch.randn(1, 16, 8, 8), [{}])


@pytest.mark.parametrize('num_layers', [1, 2])
def test_loss_and_gradients(num_layers):
    head = _head(num_decoder_layers=num_layers)
    batch = toy_batch(seed=1, empty=(1, ))  # the second frame has no boxes
    feats = torch.randn(2, 16, *BEV, requires_grad=True)
    losses = head.loss_by_feat(head(feats, [{}, {}]), gt_of(batch))
    expected = {'loss_heatmap', 'layer_-1_loss_cls', 'layer_-1_loss_bbox', 'matched_ious'}
    if num_layers == 2:
        expected |= {'layer_0_loss_cls', 'layer_0_loss_bbox'}
    assert set(losses) == expected
    total = sum(v for k, v in losses.items() if 'loss' in k)
    assert torch.isfinite(total) and total > 0
    total.backward()
    assert feats.grad.abs().sum() > 0
    no_grad = [n for n, p in head.named_parameters() if p.grad is None]
    assert not no_grad, no_grad


def test_heatmap_target_non_square_grid():
    grid = [128, 64, 41]
    pcr = [-12.8, -6.4, -5.0, 12.8, 6.4, 3.0]
    head = build(tiny_head_cfg(in_channels=16, grid=grid, pcr=pcr))
    box = LiDARInstance3DBoxes(torch.tensor([[8.8, 2.4, -1.8, 4, 2, 1.6, 0, 0, 0]]),
                               box_dim=9)
    heatmap = head._heatmap_target(box, torch.tensor([0]), 'cpu')
    assert heatmap.shape == (10, 16, 8)  # [K, X, Y]
    peak = torch.nonzero(heatmap[0] == 1)
    x_cell, y_cell = 13, 5  # cell centres: x = -12.8 + 1.6 * 13.5, y = -6.4 + 1.6 * 5.5
    assert peak.tolist() == [[x_cell, y_cell]]
    preds = head(torch.randn(1, 16, 16, 8), [{}])[0][0]
    assert preds['dense_heatmap'].shape == (1, 10, 16, 8)


def test_local_maxima_kernel_sizes():
    heat = torch.rand(1, 10, 6, 6)
    one = _head()
    one.nms_kernel_size = 1
    assert torch.equal(one._local_maxima(heat), heat)
    three = _head()
    kept = three._local_maxima(heat)
    assert (kept[:, :8, 0] == 0).all()  # border suppressed (upstream's behaviour)
    assert torch.equal(kept[:, 8:], heat[:, 8:])  # pedestrian, cone: every cell
    with pytest.raises(ValueError, match='nms_kernel_size'):
        build(dict(tiny_head_cfg(), nms_kernel_size=2))


@pytest.mark.parametrize('nms_type', [None, 'circle', 'rotate'])
def test_predict(nms_type):
    head = _head(nms_type=nms_type).eval()
    metas = [dict(box_type_3d=LiDARInstance3DBoxes)] * 2
    with torch.no_grad():
        results = head.predict(torch.randn(2, 16, *BEV), metas)
    assert len(results) == 2
    for res in results:
        assert isinstance(res.bboxes_3d, LiDARInstance3DBoxes)
        assert res.bboxes_3d.tensor.shape[1] == 9
        assert len(res.scores_3d) == len(res.labels_3d) == len(res.bboxes_3d) <= 20
        assert (res.scores_3d >= 0).all() and (res.scores_3d <= 1).all()
        assert res.labels_3d.dtype == torch.int32
    if nms_type is None:
        assert len(results[0].scores_3d) == 20


def test_predict_score_is_product_of_heatmap_and_class_score():
    head = _head().eval()
    head.bbox_coder.post_center_range = None  # keep every proposal
    feats = torch.randn(1, 16, *BEV)
    with torch.no_grad():
        preds = head(feats, [{}])
        res = head.predict_by_feat(preds, [dict(box_type_3d=LiDARInstance3DBoxes)])[0]
    p = preds[0][0]
    labels = p['query_labels'][0]
    scores = p['heatmap'][0].sigmoid().gather(0, labels[None])[0] * \
        p['query_heatmap_score'][0].gather(0, labels[None])[0]
    assert torch.allclose(res.scores_3d, scores)  # nothing filtered: order kept
    assert torch.equal(res.labels_3d.long(), labels)


def test_losses_are_normalised_over_the_micro_batch():
    """Why `1 process x batch 2` is not `batch 1 x accumulation 2` for this head
    (docs/parity.md): every loss divides by the positives of the whole micro-batch, so
    a batch of two frames weights each object equally, while two accumulated batches
    of one (or two GPUs of one, under DDP) weight each frame equally."""
    head = _head()
    head.eval()  # per-frame forward passes identical in the batch and alone
    torch.manual_seed(0)
    feats = torch.randn(2, 16, *BEV)
    batch = toy_batch(seed=3, n_boxes=4)
    gts = gt_of(batch)
    gts[0] = gts[0][:1]  # 1 object in the first frame, 4 in the second
    with torch.no_grad():
        together = head.loss_by_feat(head(feats, [{}, {}]), gts)
        alone, heat_pos, box_pos = [], [], []
        for i in range(2):
            preds = head(feats[i:i + 1], [{}])
            alone.append(head.loss_by_feat(preds, gts[i:i + 1]))
            targets = head.get_targets(gts[i:i + 1], preds[0][0])
            box_pos.append(max(targets[5], 1))
            heat_pos.append(max(targets[7].eq(1).sum().item(), 1))
    assert heat_pos == [1, 4]
    for key, pos in (('loss_heatmap', heat_pos), ('layer_-1_loss_cls', box_pos),
                     ('layer_-1_loss_bbox', box_pos)):
        per_object = sum(a[key] * n for a, n in zip(alone, pos)) / sum(pos)
        per_frame = (alone[0][key] + alone[1][key]) / 2
        assert together[key].item() == pytest.approx(per_object.item(), rel=1e-4), key
        if key == 'loss_heatmap':
            assert abs(per_frame - per_object) > 0.05 * per_object


@pytest.mark.parametrize('positives', [True, False])
def test_box_loss_is_mmdets_l1_loss_without_its_host_read(positives):
    """The head computes mmdet's L1Loss itself, without the ``torch.any(weight > 0)``
    test that waits for the GPU: the same loss and gradient, also with no positive
    proposal (every weight 0)."""
    from mmdet3d_scaling.diagnostics.host_reads import HostReadCensus
    head = build(tiny_head_cfg())
    g = torch.Generator().manual_seed(0)
    target = torch.randn(2, 20, 10, generator=g)
    weight = (torch.rand(2, 20, 10, generator=g) > 0.7).float() * float(positives)
    results = []
    for compute in (head._box_loss, head.loss_bbox):
        pred = torch.randn(2, 20, 10, generator=torch.Generator().manual_seed(1),
                           requires_grad=True)
        with HostReadCensus() as census:
            loss = compute(pred, target, weight, avg_factor=7)
        loss.backward()
        results.append((loss.detach(), pred.grad, census.counts))
    (ours, our_grad, our_reads), (mmdet, mmdet_grad, mmdet_reads) = results
    assert torch.equal(ours, mmdet) and torch.equal(our_grad, mmdet_grad)
    assert not our_reads and mmdet_reads  # the read exists upstream, so the test can fail


def _class_scores(device: str):
    """Scores ``[N, C]``, labels with background (= C) rows and weights 0 / 1 / 2."""
    g = torch.Generator().manual_seed(2)
    n, c = 96, 10
    score = (torch.randn(n, c, generator=g) * 3).to(device).requires_grad_()
    labels = torch.randint(0, c + 1, (n, ), generator=g).to(device)
    weight = torch.randint(0, 3, (n, ), generator=g).float().to(device)
    return score, labels, weight


def _loss_and_grad(compute, score, labels, weight):
    loss = compute(score, labels, weight, avg_factor=11)
    grad, = torch.autograd.grad(loss, score)
    return loss.detach(), grad


def test_cls_loss_is_mmdets_focal_loss_on_the_cpu():
    """On a CPU mmdet's FocalLoss makes the one-hot targets itself: the head's one-hot
    targets give the same loss and gradient, bit for bit (background rows included)."""
    head = build(tiny_head_cfg())
    score, labels, weight = _class_scores('cpu')
    ours = _loss_and_grad(head._cls_loss, score, labels, weight)
    mmdet = _loss_and_grad(head.loss_cls, score, labels, weight)
    assert torch.equal(ours[0], mmdet[0]) and torch.equal(ours[1], mmdet[1])
    assert ours[0] > 0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_cls_loss_on_cuda_is_mmcvs_focal_loss_without_waiting():
    """On CUDA mmdet's FocalLoss calls mmcv's op, whose forward and backward each read
    ``target.max()`` back; the head's path gives the same loss and gradient within
    float rounding and makes no synchronizing call (sync debug mode 'error' raises on
    mmcv's, so the test can fail)."""
    head = build(tiny_head_cfg()).cuda()
    score, labels, weight = _class_scores('cuda')
    mmcv = _loss_and_grad(head.loss_cls, score, labels, weight)
    ours = _loss_and_grad(head._cls_loss, score, labels, weight)  # warm-up too
    torch.cuda.synchronize()
    for compute, waits in ((head._cls_loss, False), (head.loss_cls, True)):
        torch.cuda.set_sync_debug_mode('error')
        try:
            _loss_and_grad(compute, score, labels, weight)
            waited = False
        except RuntimeError as err:
            assert 'synchronizing' in str(err), err
            waited = True
        finally:
            torch.cuda.set_sync_debug_mode('default')
        assert waited == waits, compute
    torch.testing.assert_close(ours[0], mmcv[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours[1], mmcv[1], rtol=1e-4, atol=1e-7)
