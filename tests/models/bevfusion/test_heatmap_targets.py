"""The one-pass heatmap targets equal upstream's per-box loop, bit for bit.

The reference is mmdet3d 1.4 ``projects/BEVFusion``'s ``get_targets_single`` drawing
loop, written with mmdet3d's own ``gaussian_radius`` / ``draw_heatmap_gaussian`` on
0-dim tensors of the device under test (the CPU here; CUDA as well when there is one).
"""
import numpy as np
import pytest
import torch

from mmdet3d.models.utils import draw_heatmap_gaussian, gaussian_radius
from mmdet3d.registry import MODELS
from mmengine.registry import DefaultScope
from mmdet3d.structures import LiDARInstance3DBoxes
from mmdet3d_scaling.models.bevfusion.heatmap_targets import (box_centres_and_radii,
                                                             draw_heatmap, scalar_div)

from .common import tiny_head_cfg

# BEVFusion's nuScenes settings
VOXEL = [0.075, 0.075, 0.2]
PCR = [-54.0, -54.0, -5.0, 54.0, 54.0, 3.0]
OSF, GRID, OVERLAP, MIN_RADIUS, CLASSES = 8, [1440, 1440, 41], 0.1, 2, 10
DEVICES = ['cpu'] + (['cuda'] if torch.cuda.is_available() else [])


NUSCENES = dict(voxel_size=VOXEL, point_cloud_range=PCR, out_size_factor=OSF, grid_size=GRID,
                gaussian_overlap=OVERLAP, min_radius=MIN_RADIUS)


def upstream_heatmap(boxes3d: LiDARInstance3DBoxes, labels: torch.Tensor, device,
                     cfg: dict = NUSCENES, classes: int = CLASSES):
    voxel, pcr, osf = cfg['voxel_size'], cfg['point_cloud_range'], cfg['out_size_factor']
    x_size, y_size = cfg['grid_size'][0] // osf, cfg['grid_size'][1] // osf
    heatmap = torch.zeros(classes, x_size, y_size, device=device)
    boxes = torch.cat([boxes3d.gravity_center, boxes3d.tensor[:, 3:]], dim=1).to(device)
    for box, label in zip(boxes, labels):
        width = box[3] / voxel[0] / osf
        length = box[4] / voxel[1] / osf
        if width > 0 and length > 0:
            radius = gaussian_radius((length, width), min_overlap=cfg['gaussian_overlap'])
            radius = max(cfg['min_radius'], int(radius))
            x = (box[0] - pcr[0]) / voxel[0] / osf
            y = (box[1] - pcr[1]) / voxel[1] / osf
            centre = torch.stack([y, x]).to(torch.int32)
            draw_heatmap_gaussian(heatmap[int(label)], centre, radius)
    return heatmap


def scene(n: int, seed: int, device: str):
    g = torch.Generator().manual_seed(seed)
    xyz = (torch.rand(n, 3, generator=g) * 2 - 1) * torch.tensor([60.0, 60.0, 3.0])
    cell = VOXEL[0] * OSF  # a third of the centres sit on a cell boundary, +-1 ulp
    on_edge = torch.round(xyz[:, :2] / cell) * cell
    xyz[: n // 3, :2] = torch.nextafter(on_edge[: n // 3],
                                        on_edge[: n // 3] + torch.randn(n // 3, 2, generator=g))
    size = torch.rand(n, 3, generator=g) * torch.tensor([12.0, 4.0, 3.0])
    size[: n // 8, :2] *= torch.tensor([-1.0, 0.0])  # no BEV extent: skipped
    size[n // 8: n // 4, :2] *= 0.02  # below one cell: the minimum radius
    yaw = torch.rand(n, 1, generator=g) * 6.28
    vel = torch.randn(n, 2, generator=g)
    boxes = LiDARInstance3DBoxes(torch.cat([xyz, size, yaw, vel], 1).to(device),
                                 box_dim=9)
    return boxes, torch.randint(0, CLASSES, (n, ), generator=g).to(device)


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('seed', range(4))
def test_one_pass_heatmap_equals_upstream_loop(device, seed):
    boxes3d, labels = scene(300, seed, device)
    boxes = torch.cat([boxes3d.gravity_center, boxes3d.tensor[:, 3:]], dim=1).cpu()
    keep, centres, radii = box_centres_and_radii(
        boxes, VOXEL, PCR, OSF, OVERLAP, MIN_RADIUS, cuda=device == 'cuda')
    ours = draw_heatmap(labels.cpu()[keep], centres, radii, CLASSES, GRID[0] // OSF,
                        GRID[1] // OSF)
    expected = upstream_heatmap(boxes3d, labels, device).cpu()
    assert expected.count_nonzero() > 1000
    assert torch.equal(ours, expected)


def test_the_device_decides_how_a_python_divisor_rounds():
    x = torch.tensor([0.3, 1.7, 54.0, 12.345678])
    assert torch.equal(scalar_div(x, 0.075, cuda=False), x / 0.075)
    if torch.cuda.is_available():
        assert torch.equal(scalar_div(x, 0.075, cuda=True), (x.cuda() / 0.075).cpu())
    # the two roundings differ somewhere, so following the device matters
    many = torch.linspace(-54, 54, 100_001)
    assert not torch.equal(scalar_div(many, 0.075, True), scalar_div(many, 0.075, False))


@pytest.mark.parametrize('device', DEVICES)
def test_head_heatmap_target_equals_upstream_with_the_head_settings(device):
    # mmdet3d's scope whatever an earlier test of this process left (xdist workers)
    with DefaultScope.overwrite_default_scope('mmdet3d'):
        head = MODELS.build(tiny_head_cfg()).to(device)
    boxes3d, labels = scene(60, 7, device)
    got = head._heatmap_target(boxes3d, labels, torch.device(device))
    expected = upstream_heatmap(boxes3d, labels, device, head.train_cfg, head.num_classes)
    assert got.device.type == device and expected.count_nonzero() > 0
    assert torch.equal(got, expected)


@pytest.mark.parametrize('label', [-1, CLASSES])
def test_a_label_outside_the_classes_is_a_clear_error(label):
    """Upstream's ``heatmap[label]`` raises for ``label >= K`` and draws a negative one
    into another class; set cells of a batch would land in the next sample's map."""
    from mmdet3d_scaling.models.bevfusion.heatmap_targets import heatmap_cells
    with pytest.raises(ValueError, match=f'label {label}'):
        heatmap_cells(torch.tensor([label]), torch.tensor([[5, 5]], dtype=torch.int32),
                      torch.tensor([2]), CLASSES, 20, 20)


def test_a_batch_drawn_at_once_equals_its_samples_drawn_one_by_one():
    from mmdet3d_scaling.models.bevfusion.heatmap_targets import heatmap_cells
    x_size, y_size = GRID[0] // OSF, GRID[1] // OSF
    samples = []
    for seed in range(3):
        boxes3d, labels = scene(50, seed, 'cpu')
        boxes = torch.cat([boxes3d.gravity_center, boxes3d.tensor[:, 3:]], dim=1)
        keep, centres, radii = box_centres_and_radii(boxes, VOXEL, PCR, OSF, OVERLAP,
                                                     MIN_RADIUS, cuda=False)
        samples.append((labels[keep], centres, radii))
    per_map = CLASSES * x_size * y_size
    one_by_one = [heatmap_cells(*s, CLASSES, x_size, y_size) for s in samples]
    maps = torch.cat([torch.full((len(s[0]), ), i) for i, s in enumerate(samples)])
    cells, values = heatmap_cells(*(torch.cat(parts) for parts in zip(*samples)), CLASSES,
                                  x_size, y_size, maps=maps)
    assert len(cells) > 3000
    assert np.array_equal(cells, np.concatenate([c + i * per_map
                                                 for i, (c, _) in enumerate(one_by_one)]))
    assert np.array_equal(values, np.concatenate([v for _, v in one_by_one]))
    # a label one past the classes is an error, not a cell of the next sample's map
    samples[0][0][0] = CLASSES
    with pytest.raises(ValueError, match=f'label {CLASSES}'):
        heatmap_cells(*(torch.cat(parts) for parts in zip(*samples)), CLASSES, x_size,
                      y_size, maps=maps)
