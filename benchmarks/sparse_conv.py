"""Sparse-encoder forward + backward: mmcv's sparse conv, its batched patch, spconv 2.x.

The encoders as the configs build them: BEVFusion's (``BEVFusionSparseEncoder``,
nuScenes grid 1440 x 1440 x 41 at 0.075 m) and mmdet3d's ``SparseEncoder`` of SECOND /
PV-RCNN (KITTI grid 41 x 1600 x 1408 at 0.05 m), on a batch of voxelized
nuScenes-like scans (``benchmarks/voxelization.py``). The backend is the process's: spconv
when it imports (mmdet3d registers it, as for users who installed it), else mmcv;
``--batched`` applies the ``sparse_conv_batched`` patch to mmcv's op. Run once per backend:

    PYTHONPATH=<no spconv> python benchmarks/sparse_conv.py --out mmcv.json
    PYTHONPATH=<no spconv> python benchmarks/sparse_conv.py --batched --out batched.json
    PYTHONPATH=<spconv>    python benchmarks/sparse_conv.py --out spconv.json

Per model and precision: ms per fwd+bwd (median over ``--repeats`` after ``--warmup``,
synchronised), CUDA kernels a step (profiler), peak allocated memory of a step.
``--precision`` bf16 / fp16 run the encoder under autocast and report what reached the
convs (spconv 2.3.8's dtypes; mmcv's op takes fp32 / fp16 of one dtype only).
"""
import argparse
import json
import os.path as osp
import statistics
import sys
import time
from typing import Callable, Dict, List

import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, osp.dirname(osp.abspath(__file__)))

import mmdet3d_scaling  # noqa: E402,F401
from mmdet3d.models.layers.spconv import IS_SPCONV2_AVAILABLE  # noqa: E402
from mmdet3d.registry import MODELS  # noqa: E402
from mmdet3d.utils import register_all_modules  # noqa: E402
from mmdet3d_scaling.ops import hard_voxelize  # noqa: E402
from mmdet3d_scaling.patches import patching  # noqa: E402
from voxelization import nuscenes_like_scan  # noqa: E402

MODEL_CFGS = {
    'bevfusion': dict(
        encoder=dict(
            type='BEVFusionSparseEncoder', in_channels=5, sparse_shape=[1440, 1440, 41],
            order=('conv', 'norm', 'act'),
            norm_cfg=dict(type='BN1d', eps=0.001, momentum=0.01),
            encoder_channels=((16, 16, 32), (32, 32, 64), (64, 64, 128), (128, 128)),
            encoder_paddings=((0, 0, 1), (0, 0, 1), (0, 0, (1, 1, 0)), (0, 0)),
            block_type='basicblock'),
        voxel=[0.075, 0.075, 0.2], range=[-54.0, -54.0, -5.0, 54.0, 54.0, 3.0],
        max_points=10, max_voxels=120000, points=300000, xyz_order=True),
    'second': dict(
        encoder=dict(type='SparseEncoder', in_channels=4, sparse_shape=[41, 1600, 1408],
                     order=('conv', 'norm', 'act')),
        voxel=[0.05, 0.05, 0.1], range=[0.0, -40.0, -3.0, 70.4, 40.0, 1.0],
        max_points=5, max_voxels=16000, points=120000, xyz_order=False),
}
AUTOCAST = {'fp32': None, 'bf16': torch.bfloat16, 'fp16': torch.float16}


def backend_name(batched: bool) -> str:
    if IS_SPCONV2_AVAILABLE:
        return 'spconv'
    return 'mmcv_batched' if batched else 'mmcv'


def voxel_batch(name: str, batch: int, device: str):
    """Mean point features and (batch, spatial...) int32 coordinates of ``batch`` scans."""
    cfg = MODEL_CFGS[name]
    feats, coords = [], []
    for i in range(batch):
        points = nuscenes_like_scan(cfg['points'], seed=i).to(device)
        points = points[:, :cfg['encoder']['in_channels']]
        voxels, coors, counts = hard_voxelize(points, cfg['voxel'], cfg['range'],
                                              cfg['max_points'], cfg['max_voxels'])
        feats.append(voxels.sum(1) / counts.clamp(min=1)[:, None].to(voxels.dtype))
        if cfg['xyz_order']:  # mmcv's voxelizer gives (z, y, x); BEVFusion reads (x, y, z)
            coors = coors.flip(1)
        coords.append(torch.nn.functional.pad(coors, (1, 0), value=i))
    return torch.cat(feats), torch.cat(coords).int()


def _step(model, feats, coords, batch, dtype) -> Callable[[], None]:
    def run():
        with torch.autocast('cuda', dtype=dtype or torch.float32, enabled=dtype is not None):
            out = model(feats, coords, batch)
        out = out[0] if isinstance(out, tuple) else out
        out.float().square().mean().backward()
    return run


def _kernels(fn: Callable[[], None]) -> int:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type.name == 'CUDA')


def top_kernels(fn: Callable[[], None], n: int = 12) -> List[Dict]:
    """The ``n`` CUDA kernels with the most total time in one call of ``fn``."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    totals: Dict[str, List[float]] = {}
    for e in prof.events():
        if e.device_type.name == 'CUDA':
            entry = totals.setdefault(e.name[:90], [0.0, 0])
            entry[0] += e.time_range.elapsed_us() / 1e3
            entry[1] += 1
    rows = sorted(totals.items(), key=lambda kv: -kv[1][0])[:n]
    return [dict(kernel=k, ms=round(v[0], 2), calls=v[1]) for k, v in rows]


def measure(name: str, precision: str, batch: int, warmup: int, repeats: int,
            profile_kernels: bool = False) -> Dict:
    cfg = MODEL_CFGS[name]
    torch.manual_seed(0)
    model = MODELS.build(dict(cfg['encoder'])).cuda().train()
    feats, coords = voxel_batch(name, batch, 'cuda')
    run = _step(model, feats, coords, batch, AUTOCAST[precision])
    try:
        for _ in range(warmup):
            run()
    except Exception as err:  # noqa: BLE001  (a dtype the backend lacks: say which)
        return dict(model=name, precision=precision, error=f'{type(err).__name__}: {err}'[:300])
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times: List[float] = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return dict(model=name, precision=precision, batch=batch, voxels=int(len(feats)),
                ms_median=round(statistics.median(times), 2), ms_min=round(min(times), 2),
                kernels=_kernels(run),
                peak_allocated_gib=round(torch.cuda.max_memory_allocated() / 2**30, 3),
                **(dict(top_kernels=top_kernels(run)) if profile_kernels else {}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--models', default='bevfusion,second')
    parser.add_argument('--precision', default='fp32',
                        help='comma-separated: fp32, bf16, fp16 (autocast)')
    parser.add_argument('--batch', type=int, default=4)
    parser.add_argument('--batched', action='store_true',
                        help="apply the sparse_conv_batched patch to mmcv's op")
    parser.add_argument('--warmup', type=int, default=3)
    parser.add_argument('--repeats', type=int, default=10)
    parser.add_argument('--profile', action='store_true',
                        help='also list the CUDA kernels with the most time in one step')
    parser.add_argument('--out')
    args = parser.parse_args()
    register_all_modules(init_default_scope=True)
    torch.backends.cuda.matmul.allow_tf32 = True  # the configs' float32_matmul_precision
    torch.backends.cudnn.allow_tf32 = True
    if args.batched:
        if IS_SPCONV2_AVAILABLE:
            raise SystemExit('--batched patches mmcv\'s op, but spconv is on the path '
                             '(mmdet3d then builds spconv convs): run without spconv.')
        patching.apply(['sparse_conv_batched'])
    backend = backend_name(args.batched)
    rows = []
    for name in args.models.split(','):
        for precision in args.precision.split(','):
            row = dict(backend=backend, **measure(name, precision, args.batch, args.warmup,
                                                  args.repeats, args.profile))
            rows.append(row)
            print(json.dumps(row, indent=None if not args.profile else 1), flush=True)
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                           rows=rows), f, indent=1)


if __name__ == '__main__':
    main()
