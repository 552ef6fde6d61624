"""Time and peak memory of a BEVFusion LiDAR-only train step at the official sizes.

Builds the model of ``configs/bevfusion/bevfusion_lidar_voxel0075_second_secfpn_nus-3d.py``
(grid 1440 x 1440 x 41, 200 proposals) on the sparse-conv backend in use and runs
train steps on synthetic point clouds shaped like nuScenes with 10 sweeps (about
300k points a sample, a ground plane plus boxes), then prints a table::

    python tools/benchmark_bevfusion_lidar.py --batch 4 --steps 10 [--amp] [--backend mmcv]

Figures are wall-clock per train step (forward, backward, AdamW step), after
``--warmup`` steps, with ``torch.cuda.synchronize`` around each step.
"""
import argparse
import time

import numpy as np
import torch
from mmengine.config import Config
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from mmengine.registry import init_default_scope
from mmengine.structures import InstanceData

CONFIG = 'configs/bevfusion/bevfusion_lidar_voxel0075_second_secfpn_nus-3d.py'


def fake_sample(rng: np.random.Generator, n_points: int, n_boxes: int, device: str):
    from mmdet3d.structures import Det3DDataSample, LiDARInstance3DBoxes
    ground = np.c_[rng.uniform(-54, 54, (n_points, 2)), rng.normal(-1.8, 0.05, n_points),
                   rng.uniform(0, 255, n_points), rng.uniform(0, 0.5, n_points)]
    xy = rng.uniform(-45, 45, (n_boxes, 2))
    boxes = np.c_[xy, np.full(n_boxes, -1.8), np.tile([4.5, 1.9, 1.7], (n_boxes, 1)),
                  rng.uniform(-np.pi, np.pi, n_boxes), rng.normal(0, 2, (n_boxes, 2))]
    inside = [np.c_[b[:2] + rng.uniform(-2, 2, (800, 2)), rng.uniform(-1.8, 0, 800),
                    rng.uniform(0, 255, 800), np.zeros(800)] for b in boxes]
    points = torch.from_numpy(np.concatenate([ground] + inside).astype(np.float32))
    sample = Det3DDataSample(metainfo=dict(box_type_3d=LiDARInstance3DBoxes))
    gt = InstanceData()
    gt.bboxes_3d = LiDARInstance3DBoxes(torch.from_numpy(boxes).float(), box_dim=9)
    gt.labels_3d = torch.from_numpy(rng.integers(0, 10, n_boxes))
    sample.gt_instances_3d = gt.to(device)
    return points.to(device), sample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--batch', type=int, default=4, help='samples a step (default 4)')
    parser.add_argument('--steps', type=int, default=10,
                        help='timed train steps; the table gives their median '
                             '(default 10)')
    parser.add_argument('--warmup', type=int, default=3,
                        help='untimed train steps first (default 3)')
    parser.add_argument('--points', type=int, default=300_000,
                        help='ground points a sample, plus 800 in each of 30 boxes '
                             '(default 300000)')
    parser.add_argument('--amp', action='store_true', help='fp16 autocast + loss scaling')
    parser.add_argument('--backend', default='auto', choices=['auto', 'spconv', 'mmcv'],
                        help="sparse-conv backend of the encoder; 'auto': spconv when "
                             "installed, else mmcv (CUDA only)")
    args = parser.parse_args()

    import mmdet3d_scaling  # noqa: F401
    from mmdet3d.registry import MODELS
    init_default_scope('mmdet3d')
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    cfg = Config.fromfile(CONFIG)
    cfg.model.pts_middle_encoder.sparse_backend = args.backend
    model = MODELS.build(cfg.model).to(device).train()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    wrapper = AmpOptimWrapper(optimizer=optim) if args.amp else OptimWrapper(optim)

    rng = np.random.default_rng(0)
    samples = [fake_sample(rng, args.points, 30, device) for _ in range(args.batch)]
    batch = dict(inputs=dict(points=[p for p, _ in samples]),
                 data_samples=[s for _, s in samples])
    with torch.no_grad():
        _, coords, _ = model.voxelize(batch['inputs']['points'])
    times = []
    if device == 'cuda':
        torch.cuda.reset_peak_memory_stats()
    for step in range(args.warmup + args.steps):
        if device == 'cuda':
            torch.cuda.synchronize()
        start = time.perf_counter()
        log = model.train_step(batch, wrapper)
        if device == 'cuda':
            torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == 'cuda' else float('nan')
    name = torch.cuda.get_device_name() if device == 'cuda' else 'CPU'
    rows = [('device', name), ('sparse backend', model.pts_middle_encoder.backend.name),
            ('batch x points', f'{args.batch} x {args.points + 30 * 800}'),
            ('voxels in the batch', str(len(coords))), ('precision', 'fp16 AMP' if args.amp
                                                         else 'fp32'),
            ('train step (median)', f'{np.median(times) * 1e3:.0f} ms'),
            ('train step (min / max)', f'{min(times) * 1e3:.0f} / {max(times) * 1e3:.0f} ms'),
            ('peak memory allocated', f'{peak:.2f} GiB'),
            ('last loss', f'{float(log["loss"]):.3f}')]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f'| {key:<{width}} | {value} |')


if __name__ == '__main__':
    main()
