"""Hard voxelization: mmcv's deterministic and non-deterministic ops vs the sort.

BEVFusion's nuScenes settings (voxel 0.075 x 0.075 x 0.2 m, range [-54, -54, -5, 54, 54,
3], 10 points per voxel, at most 120000 voxels) on points drawn like a 10-sweep nuScenes
scan (x, y, z, intensity, sweep time lag; dense near the car, rings on the ground, walls
and objects farther out, each sweep shifted by the ego motion). Before timing, each
size's output of :func:`mmdet3d_scaling.ops.hard_voxelize` is checked tensor-equal to
mmcv's deterministic op on the same device (the script stops otherwise).

Prints a table of ms per call (median and minimum over ``--repeats`` calls after
``--warmup``; CUDA synchronised around every call) and writes it as JSON to ``--out``::

    python benchmarks/voxelization.py --device cuda --points 150000,300000 --out vox.json
    python benchmarks/voxelization.py --device cpu --points 20000,50000 --threads 1

mmcv's non-deterministic op has no CPU kernel: on the CPU its row says so.
"""
import argparse
import json
import math
import os.path as osp
import platform
import statistics
import sys
import time
from typing import Callable, Dict, List

import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

import mmcv  # noqa: E402
from mmcv.ops.voxelize import _Voxelization  # noqa: E402  (the op itself, never patched)

from mmdet3d_scaling.ops import hard_voxelize  # noqa: E402

VOXEL = [0.075, 0.075, 0.2]
RANGE = [-54.0, -54.0, -5.0, 54.0, 54.0, 3.0]
MAX_POINTS = 10
MAX_VOXELS = 120000
SWEEPS = 10
LIDAR_HEIGHT = 1.84  # m, nuScenes' roof LiDAR above the ground
RINGS_DEG = torch.linspace(-30.67, 10.67, 32)  # HDL-32E elevations


def nuscenes_like_scan(num_points: int, seed: int = 0) -> torch.Tensor:
    """``[num_points, 5]`` float32 points like a 10-sweep nuScenes LiDAR input."""
    gen = torch.Generator().manual_seed(seed)
    per_sweep = math.ceil(num_points / SWEEPS)
    sweeps = []
    for sweep in range(SWEEPS):
        ring = RINGS_DEG[torch.randint(0, 32, (per_sweep,), generator=gen)]
        azimuth = torch.rand(per_sweep, generator=gen) * 2 * math.pi
        # downward rings hit the ground; the rest hit walls and objects 3-70 m out
        ground = LIDAR_HEIGHT / torch.tan(torch.deg2rad(-ring)).clamp(min=1e-3)
        uniform = torch.rand(per_sweep, generator=gen).clamp(min=1e-7)
        obstacle = 3.0 - 15.0 * torch.log(uniform)  # exponential, mean 18 m
        reach = torch.where(ring < 0, torch.minimum(ground, obstacle), obstacle)
        reach = reach.clamp(max=70.0)
        reach = reach + torch.randn(per_sweep, generator=gen) * 0.02
        x = reach * torch.cos(azimuth)
        y = reach * torch.sin(azimuth)
        z = reach * torch.tan(torch.deg2rad(ring))  # LiDAR frame: ground at -1.84
        ego_shift = 0.5 * sweep  # m a sweep (10 m/s at 20 Hz), older sweeps behind
        intensity = torch.rand(per_sweep, generator=gen) * 255
        lag = torch.full((per_sweep,), 0.05 * sweep)
        sweeps.append(torch.stack([x - ego_shift, y, z, intensity, lag], dim=1))
    return torch.cat(sweeps)[:num_points].float().contiguous()


def _mmcv(deterministic: bool) -> Callable:
    def run(points):
        return _Voxelization.apply(points, VOXEL, RANGE, MAX_POINTS, MAX_VOXELS,
                                   deterministic)
    return run


def _ours(points):
    return hard_voxelize(points, VOXEL, RANGE, MAX_POINTS, MAX_VOXELS)


def _time(fn: Callable, points: torch.Tensor, warmup: int, repeats: int) -> List[float]:
    cuda = points.is_cuda
    for _ in range(warmup):
        fn(points)
    times = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn(points)
        if cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def check_equal(points: torch.Tensor) -> int:
    """Ours vs mmcv's deterministic op on ``points``' device; returns the voxel count."""
    ref = _mmcv(True)(points)
    got = _ours(points)
    for name, a, b in zip(('voxels', 'coors', 'num_points'), got, ref):
        if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
            raise SystemExit(f'{name} differs from mmcv\'s deterministic op at '
                             f'{len(points)} points: {tuple(a.shape)} {a.dtype} vs '
                             f'{tuple(b.shape)} {b.dtype}')
    return int(ref[0].shape[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--points', default='150000,300000',
                        help='comma-separated point counts')
    parser.add_argument('--warmup', type=int, default=3)
    parser.add_argument('--repeats', type=int, default=20)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--threads', type=int, help='torch CPU threads (default: torch\'s)')
    parser.add_argument('--out', help='JSON file to write')
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    impls: Dict[str, Callable] = {'mmcv deterministic': _mmcv(True)}
    if device.type == 'cuda':  # mmcv has no CPU kernel of its non-deterministic op
        impls['mmcv non-deterministic'] = _mmcv(False)
    impls['ours (sort)'] = _ours
    rows = []
    for n in (int(v) for v in args.points.split(',')):
        points = nuscenes_like_scan(n, args.seed).to(device)
        voxels = check_equal(points)
        for name, fn in impls.items():
            times = _time(fn, points, args.warmup, args.repeats)
            rows.append(dict(points=n, voxels=voxels, impl=name,
                             ms_median=round(statistics.median(times), 3),
                             ms_min=round(min(times), 3)))
        mmcv_ms = rows[-len(impls)]['ms_median']
        rows[-1]['speedup_vs_mmcv_deterministic'] = round(mmcv_ms / rows[-1]['ms_median'], 2)
    print(f'{"points":>8} {"voxels":>8}  {"implementation":<24}{"ms median":>10}'
          f'{"ms min":>9}')
    for r in rows:
        speedup = r.get('speedup_vs_mmcv_deterministic')
        print(f'{r["points"]:>8} {r["voxels"]:>8}  {r["impl"]:<24}{r["ms_median"]:>10.3f}'
              f'{r["ms_min"]:>9.3f}' + (f'  ({speedup}x)' if speedup else ''))
    if device.type != 'cuda':
        print('(mmcv non-deterministic: no CPU kernel in mmcv)')
    result = dict(
        device=str(device),
        device_name=torch.cuda.get_device_name(device) if device.type == 'cuda'
        else platform.processor() or platform.machine(),
        torch=torch.__version__, mmcv=mmcv.__version__, threads=torch.get_num_threads(),
        settings=dict(voxel_size=VOXEL, point_cloud_range=RANGE,
                      max_num_points=MAX_POINTS, max_voxels=MAX_VOXELS, sweeps=SWEEPS,
                      features=5, seed=args.seed),
        warmup=args.warmup, repeats=args.repeats, equal_to_mmcv_deterministic=True,
        rows=rows)
    if args.out:
        with open(args.out, 'w', encoding='utf-8') as f:
            json.dump(result, f, indent=2)
        print(f'wrote {args.out}')


if __name__ == '__main__':
    main()
