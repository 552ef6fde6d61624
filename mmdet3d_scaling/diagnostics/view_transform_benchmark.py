"""Time and peak memory of BEVFusion's DepthLSSTransform (forward + backward, training
mode) at the official sizes, with and without the memory options.

Official sizes: 6 cameras, 256-channel 32 x 88 image features, LiDAR depth maps of
256 x 704 from 200k points per sample, 118 depth bins, 80 channels, 360 x 360 grid.
Rows: plain (the frustum tensor is materialised, as upstream), ``memory_efficient``
(lean pooling), ``with_cp`` (checkpointed depth-net + pooling), both.

    python tools/benchmark_view_transform.py                 # CUDA, B = 1 and 4
    python tools/benchmark_view_transform.py --batch 1 --iters 3
"""
import argparse
import math
import os
import sys
import time
import types
from typing import List, Optional

import torch
from torch import nn

OFFICIAL = dict(in_channels=256, out_channels=80, image_size=[256, 704],
                feature_size=[32, 88], xbound=[-54.0, 54.0, 0.3],
                ybound=[-54.0, 54.0, 0.3], zbound=[-10.0, 10.0, 20.0],
                dbound=[1.0, 60.0, 0.5], downsample=2)
OPTIONS = {
    'plain (materialised frustum)': {},
    'memory_efficient': dict(memory_efficient=True),
    'with_cp': dict(with_cp=True),
    'memory_efficient + with_cp': dict(memory_efficient=True, with_cp=True),
}


def import_transform():
    """``DepthLSSTransform`` of the plugin's BEVFusion."""
    from mmdet3d_scaling.models.bevfusion.depth_lss import DepthLSSTransform
    return DepthLSSTransform


def rig(batch: int, device: str):
    """nuScenes-like 6-camera ring: lidar2img, cam2img, cam2lidar ``(B, 6, 4, 4)``."""
    K = torch.eye(4)
    K[0, 0] = K[1, 1] = 1266.0 * 0.48
    K[0, 2], K[1, 2] = 352.0, 128.0
    l2i, c2l = [], []
    for n in range(6):
        yaw = 2 * math.pi * n / 6
        m = torch.eye(4)
        m[:3, :3] = torch.tensor([[math.sin(yaw), 0.0, math.cos(yaw)],
                                  [-math.cos(yaw), 0.0, math.sin(yaw)],
                                  [0.0, -1.0, 0.0]])
        m[:3, 3] = torch.tensor([1.0 * math.cos(yaw), 1.0 * math.sin(yaw), 1.6])
        c2l.append(m)
        l2i.append(K @ torch.linalg.inv(m))
    expand = lambda ms: torch.stack(ms).expand(batch, 6, 4, 4).contiguous().to(device)
    return expand(l2i), expand([K] * 6), expand(c2l)


def make_inputs(batch: int, device: str):
    g = torch.Generator(device=device).manual_seed(0)
    img = torch.randn(batch, 6, 256, 32, 88, device=device, generator=g)
    points = [(torch.rand(200_000, 5, device=device, generator=g) - 0.5) *
              torch.tensor([108.0, 108.0, 8.0, 1.0, 1.0], device=device)
              for _ in range(batch)]
    l2i, k, c2l = rig(batch, device)
    img_aug = torch.eye(4, device=device).expand(batch, 6, 4, 4).clone()
    lidar_aug = torch.eye(4, device=device).expand(batch, 4, 4).clone()
    return img, points, l2i, k, c2l, img_aug, lidar_aug


def measure(transform_cls, options: dict, batch: int, device: str, iters: int) -> dict:
    torch.manual_seed(0)
    model = transform_cls(**OFFICIAL, **options).to(device).train()
    img, *rest = make_inputs(batch, device)
    img.requires_grad_()

    def step():
        out = model(img, *rest, None)
        out.square().mean().backward()
        return out

    out = step()  # warm-up (Triton compilation, allocator)
    if device == 'cuda':
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    start = time.perf_counter()
    for _ in range(iters):
        out = step()
    if device == 'cuda':
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    else:
        peak = float('nan')
    ms = (time.perf_counter() - start) * 1000 / iters
    return dict(ms=ms, peak=peak, out=out.detach(), grad=img.grad.detach().clone())


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu',
                        help='device to measure on (default: cuda when available; peak '
                             'memory only on CUDA)')
    parser.add_argument('--batch', type=int, nargs='+', default=[1, 4],
                        help='batch sizes, one table block each (default 1 4)')
    parser.add_argument('--iters', type=int, default=5,
                        help='timed forward + backward passes per row, after one warm-up '
                             '(default 5)')
    args = parser.parse_args(argv)
    DepthLSSTransform = import_transform()
    print(f'device={args.device} torch={torch.__version__}')
    print(f'{"options":30s} {"B":>2s} {"fwd+bwd ms":>11s} {"peak MiB":>9s} '
          f'{"max rel diff":>12s}')
    for batch in args.batch:
        ref = None
        for name, options in OPTIONS.items():
            row = measure(DepthLSSTransform, options, batch, args.device, args.iters)
            if ref is None:
                ref, diff = row, 0.0
            else:
                diff = max(((row[k] - ref[k]).abs().max() /
                            ref[k].abs().max()).item() for k in ('out', 'grad'))
            print(f'{name:30s} {batch:2d} {row["ms"]:11.1f} {row["peak"]:9.0f} '
                  f'{diff:12.1e}')
            del row
            if args.device == 'cuda':
                torch.cuda.empty_cache()


if __name__ == '__main__':
    main()
