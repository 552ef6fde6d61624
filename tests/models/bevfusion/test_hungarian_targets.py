"""TransFusion targets of a whole batch with one host read: the same targets as the
per-sample path (upstream's order of work), on the CPU and, where there is one, on CUDA."""
import copy

import pytest
import torch

from mmdet3d_scaling.diagnostics.host_reads import HostReadCensus
from mmdet3d_scaling.models.bevfusion.hungarian_targets import batch_targets

from .common import GRID, OSF, build, gt_of, tiny_head_cfg, toy_batch

BEV = (GRID[0] // OSF, GRID[1] // OSF)
DEVICES = ['cpu'] + (['cuda'] if torch.cuda.is_available() else [])


def _head(device, num_layers=1, pos_weight=-1):
    cfg = tiny_head_cfg(num_decoder_layers=num_layers)
    cfg['train_cfg']['pos_weight'] = pos_weight
    return build(cfg).to(device)


def _inputs(device, seed, empty=()):
    torch.manual_seed(seed)
    batch = toy_batch(seed=seed, batch_size=3, n_boxes=5, empty=empty)
    gts = [g.to(device) for g in gt_of(batch)]
    feats = torch.randn(3, 64, *BEV, device=device)
    return gts, feats


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('num_layers,pos_weight,empty', [
    (1, -1, ()), (2, -1, (1, )), (2, 2.0, ()), (1, -1, (0, 1, 2))])
def test_batch_targets_equal_per_sample_targets(device, num_layers, pos_weight, empty):
    head = _head(device, num_layers, pos_weight)
    gts, feats = _inputs(device, seed=num_layers, empty=empty)
    with torch.no_grad():
        preds = head(feats, [{}] * 3)[0][0]
        ours = batch_targets(head, copy.deepcopy(gts), preds)
        reference = head.targets_per_sample(copy.deepcopy(gts), preds)
    assert len(ours) == len(reference) == 9
    names = ['labels', 'label_weights', 'bbox_targets', 'bbox_weights', 'ious',
             'num_pos', 'matched_ious', 'heatmap', 'peaks']
    for name, a, b in zip(names, ours, reference):
        if name == 'matched_ious':  # a logged value: summed over other proposal sets
            assert a.item() == pytest.approx(b.item(), rel=1e-6, abs=1e-7)
        elif isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and a.device == b.device, name
            assert torch.equal(a, b), name
        else:
            assert a == b, name
    if len(empty) < 3:
        assert ours[5] > 0  # the comparison covered matches


def test_head_uses_the_batch_path_and_losses_are_unchanged():
    head = _head('cpu', num_layers=2)
    gts, feats = _inputs('cpu', seed=4, empty=(2, ))
    preds = head(feats, [{}] * 3)
    losses = head.loss_by_feat(preds, copy.deepcopy(gts))
    # the per-sample reference (it takes no prefetched boxes)
    head.get_targets = lambda gts, preds, heatmaps=None: head.targets_per_sample(
        gts, preds)
    reference = head.loss_by_feat(preds, copy.deepcopy(gts))
    assert set(losses) == set(reference)
    for key in losses:
        if key == 'matched_ious':
            assert losses[key].item() == pytest.approx(reference[key].item(), rel=1e-6)
        else:
            assert torch.equal(losses[key], reference[key]), key


def test_one_host_read_for_the_batch():
    """The per-sample path reads back per sample; the batch path once (the cost
    matrices in one copy: ``.cpu()``, then ``.numpy()`` of the copy). Left out: the
    heatmap drawing (its tensors live on the host on every device) and ``HostCopy``'s
    ``numpy()`` of its pinned host buffer (on a GPU it waits for that copy alone, which
    was queued before the head's kernels)."""
    head = _head('cpu', num_layers=2)
    gts, feats = _inputs('cpu', seed=5)
    with torch.no_grad():
        preds = head(feats, [{}] * 3)[0][0]
        exclude = ('heatmap_targets.py', 'utils/device_copy.py')
        with HostReadCensus(exclude=exclude) as batch:
            batch_targets(head, copy.deepcopy(gts), preds)
        with HostReadCensus(exclude=exclude) as per_sample:
            head.targets_per_sample(copy.deepcopy(gts), preds)

    def device_reads(census):
        return {k: n for k, n in census.counts.items()
                if not any(f in k[0] for f in ('draw_heatmap_target', 'heatmap_target_cells',
                                                '_heatmap_geometry'))}
    reads = device_reads(batch)
    assert sorted(op for _, op in reads) == ['cpu', 'numpy'], reads
    assert all('to_host' in site for site, _ in reads) and sum(reads.values()) == 2, reads
    assert sum(device_reads(per_sample).values()) >= 3 * 4, per_sample.counts


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_cuda_syncs_of_the_batch_path():
    from mmdet3d_scaling.diagnostics.host_reads import SyncSiteRecorder
    head = _head('cuda', num_layers=2)
    gts, feats = _inputs('cuda', seed=6)
    with torch.no_grad():
        preds = head(feats, [{}] * 3)[0][0]
        batch_targets(head, copy.deepcopy(gts), preds)  # warm-up (pinned pools, caches)
        torch.cuda.synchronize()
        with SyncSiteRecorder() as rec:
            batch_targets(head, copy.deepcopy(gts), preds)
    assert sum(rec.counts.values()) <= 1, rec.counts


@pytest.mark.parametrize('device', DEVICES)
def test_lidar_iou_equals_mmdet3d_overlaps(device):
    from mmdet3d.structures.ops import BboxOverlaps3D
    from mmdet3d_scaling.models.bevfusion.assigners import lidar_iou_3d
    g = torch.Generator().manual_seed(0)
    boxes = torch.cat([torch.rand(40, 3, generator=g) * 6, torch.rand(40, 3, generator=g) * 3
                       + 0.2, torch.rand(40, 1, generator=g) * 6, torch.zeros(40, 2)], 1)
    a, b = boxes[:30].to(device), boxes[25:].to(device)
    ours, reference = lidar_iou_3d(a, b), BboxOverlaps3D(coordinate='lidar')(a, b)
    assert ours.dtype == reference.dtype and torch.equal(ours, reference)
    assert (ours > 0).any()


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('host,on_thread', [('none', True), ('loader', True),
                                             ('other counts', True), ('loader', False)])
def test_heatmaps_started_ahead_give_the_same_targets(device, host, on_thread):
    """BEVFusion starts the heatmap drawing before its forward (on a GPU on a host
    thread), from the loader's host ground truth where the preprocessor kept it: the
    targets equal those of a job started within ``batch_targets``, and the per-sample
    path's dense heatmaps. Host boxes whose counts differ from the device's are not
    used."""
    from mmdet3d_scaling.models.bevfusion.hungarian_targets import HeatmapJob
    head = _head(device, num_layers=2)
    gts, feats = _inputs(device, seed=7, empty=(1, ))
    host_gts = None if host == 'none' else [g.cpu() for g in gts]
    if host == 'other counts':
        host_gts[0] = host_gts[0][:1]
    ahead = HeatmapJob(head, gts, host_gts, on_thread=on_thread)
    assert ahead.from_host == (host == 'loader')
    assert (ahead._thread is not None) == (device == 'cuda' and on_thread)
    with torch.no_grad():
        preds = head(feats, [{}] * 3)[0][0]
        ours = batch_targets(head, copy.deepcopy(gts), preds, ahead)
        reference = batch_targets(head, copy.deepcopy(gts), preds)
        per_sample = head.targets_per_sample(copy.deepcopy(gts), preds)
    for a, b in zip(ours, reference):
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
    assert torch.equal(ours[7], per_sample[7]) and ours[8] == per_sample[8]
    assert ours[8] > 0


def test_one_match_cost_computation_a_layer_for_the_batch(monkeypatch):
    """The costs of a batch come from one assigner call a decoder layer, not one a
    sample and layer (each call is some sixty small launches on a GPU)."""
    head = _head('cpu', num_layers=2)
    gts, feats = _inputs('cpu', seed=6)
    calls = []
    original = head.bbox_assigner.match_cost

    def counted(*args, **kwargs):
        calls.append(len(args[0]))
        return original(*args, **kwargs)
    monkeypatch.setattr(head.bbox_assigner, 'match_cost', counted)
    with torch.no_grad():
        preds = head(feats, [{}] * 3)[0][0]
        batch_targets(head, copy.deepcopy(gts), preds)
    assert calls == [3 * head.num_proposals] * 2
