"""The LiDAR depth map of BEVFusion's camera branch: what keeping the last point of a
pixel costs, against the one-call write upstream uses (an arbitrary point on CUDA).

Inputs at nuScenes' size: ``--points`` LiDAR points a sample (10 sweeps: about 300,000)
projected into 6 cameras of ``--image`` pixels; each point lands on one camera's image
(``--on-image`` of the projections, about 1/6), the rest go to spare slots that are
dropped. Rows (median of ``--repeats`` CUDA-synchronised calls, one sample):

- ``index_put``: upstream's write, all projections at once with ``index_put_``
  (one spare slot; arbitrary winner where points share a pixel);
- ``last_write_one_spare``: ``_last_write`` with every off-image projection on one slot;
- ``last_write``: ``_last_write`` told which projections to drop (``keep``), as
  ``DepthLSSTransform.lidar_depth_map`` calls it: it spreads them over ``SPARE_SLOTS``
  slots.

It first checks that the two ``_last_write`` layouts give the same map::

    python benchmarks/depth_map_write.py --device cuda --out $OUT/depth_map_write.json
"""
import argparse
import json
import os.path as osp
import platform
import sys
from typing import Callable, Dict, List

import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from mmdet3d_scaling.models.bevfusion.depth_lss import (SPARE_SLOTS,  # noqa: E402
                                                         _last_write)
from timing import timed  # noqa: E402  (benchmarks/timing.py)


def projections(points: int, cams: int, pixels: int, on_image: float,
                device: str) -> Dict[str, torch.Tensor]:
    """Flat pixel indices of ``points x cams`` projections, their on-image mask, depths."""
    gen = torch.Generator().manual_seed(0)
    n = points * cams
    flat = torch.randint(0, cams * pixels, (n, ), generator=gen)
    hit = torch.rand(n, generator=gen) < on_image
    depth = 1 + 60 * torch.rand(n, generator=gen)
    return {k: v.to(device) for k, v in dict(flat=flat, hit=hit, depth=depth).items()}


def writers(p: Dict[str, torch.Tensor], size: int) -> Dict[str, Callable[[], torch.Tensor]]:
    flat, hit, depth = p['flat'], p['hit'], p['depth']
    one_spare = torch.where(hit, flat, torch.full_like(flat, size))

    def index_put():
        out = depth.new_zeros(size + 1)
        return out.index_put_((one_spare, ), depth)[:size]

    return dict(index_put=index_put,
                last_write_one_spare=lambda: _last_write(one_spare, depth, size + 1)[:size],
                last_write=lambda: _last_write(flat, depth, size, keep=hit))


def main(argv: List[str] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--device', choices=('cpu', 'cuda'), default='cuda')
    p.add_argument('--points', type=int, default=300_000, help='LiDAR points a sample')
    p.add_argument('--cams', type=int, default=6)
    p.add_argument('--image', type=int, nargs=2, default=[256, 704], metavar=('H', 'W'),
                   help='network input image (pixels; nuScenes configs: 256 704)')
    p.add_argument('--on-image', type=float, default=1 / 6,
                   help='share of the projections that land on their image')
    p.add_argument('--repeats', type=int, default=20)
    p.add_argument('--out', help='write the results as JSON here')
    args = p.parse_args(argv)
    if args.device == 'cuda' and not torch.cuda.is_available():
        raise SystemExit('--device cuda: torch sees no CUDA device; use --device cpu')
    size = args.cams * args.image[0] * args.image[1]
    fns = writers(projections(args.points, args.cams, size // args.cams, args.on_image,
                              args.device), size)
    if not torch.equal(fns['last_write'](), fns['last_write_one_spare']()):
        raise SystemExit('the two _last_write layouts give different maps')
    rows = {name: timed(fn, args.device, args.repeats, warmup=2)
            for name, fn in fns.items()}
    for name, seconds in rows.items():
        print(f'{name:22s} {1e3 * seconds:8.3f} ms')
    if args.out:
        device = (torch.cuda.get_device_name() if args.device == 'cuda'
                  else platform.processor() or platform.machine())
        with open(args.out, 'w', encoding='utf-8') as f:
            json.dump(dict(device=args.device, device_name=device, torch=torch.__version__,
                           threads=torch.get_num_threads(), command=' '.join(sys.argv),
                           projections=args.points * args.cams, map_pixels=size,
                           spare_slots=SPARE_SLOTS, ms={k: 1e3 * v for k, v in rows.items()}),
                      f, indent=1)
        print(f'wrote {args.out}')


if __name__ == '__main__':
    main()
