"""PV-RCNN's rotated NMS: mmdet3d's ``nms_bev`` (mmcv) vs ``mmdet3d_scaling.ops``.

Inputs like PV-RCNN's RPN proposals (``--boxes`` a sample, ``--batch`` samples): KITTI
anchors (3 classes x 2 yaws on the 176 x 200 feature map over [0, 70.4] x [-40, 40] m)
decoded with small offsets, the ``--boxes`` highest-scored kept, as the RPN head's
``nms_pre`` does. ``--scores random`` is an untrained head (proposals spread over the
scene); ``--scores objects`` a trained one (scores peak at 20 objects, proposals
crowd around them). For each setting it first checks, on ``--device``, that the kept
indices equal mmdet3d's, then times (median of ``--repeats``, CUDA-synchronised):

- ``mmdet3d``: mmdet3d's ``nms_bev`` a sample, as PV-RCNN calls it;
- ``ours``: ``mmdet3d_scaling.ops.nms_bev`` a sample (what the ``nms_bev`` patch runs);
- ``ours_grouped``: one ``nms_bev`` call for the batch (``groups`` = sample).

PV-RCNN's settings: training ``--boxes 9000 --thr 0.8`` (nms_pre 9000, batch 8 on a GPU),
testing ``--boxes 1024 --thr 0.7``; the CPU config trains with 1024 (9000 boxes take
minutes in mmcv's CPU kernel)::

    python benchmarks/nms_rotated.py --device cuda --out $OUT/nms_rotated_cuda.json
    python benchmarks/nms_rotated.py --device cpu --boxes 1024 --batch 2 \\
        --out nms_rotated_cpu.json
"""
import argparse
import json
import os.path as osp
import platform
import statistics
import sys
from typing import Dict, List

import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from mmdet3d_scaling.ops import nms_bev  # noqa: E402
from timing import timed  # noqa: E402  (benchmarks/timing.py)

SIZES = ((0.8, 0.6), (1.76, 0.6), (3.9, 1.6))  # KITTI anchors (l, w): Ped, Cyc, Car


def proposals(num: int, seed: int, scores_kind: str, device: str):
    """(xyxyr boxes as mmdet3d's nms_bev takes them, scores) of one sample."""
    from mmdet3d.structures import LiDARInstance3DBoxes, xywhr2xyxyr
    gen = torch.Generator().manual_seed(seed)
    xs = torch.linspace(0.2, 70.2, 176)
    ys = torch.linspace(-39.8, 39.8, 200)
    gx, gy = torch.meshgrid(xs, ys, indexing='ij')
    centres = torch.stack([gx.flatten(), gy.flatten()], 1)
    parts = []
    for length, width in SIZES:
        for yaw in (0., 1.57):
            n = len(centres)
            parts.append(torch.cat([centres, torch.full((n, 1), -1.), torch.full(
                (n, 1), length), torch.full((n, 1), width), torch.full((n, 1), 1.5),
                torch.full((n, 1), yaw)], 1))
    anchors = torch.cat(parts)
    n = len(anchors)
    anchors[:, :2] += 0.2 * torch.randn(n, 2, generator=gen)
    anchors[:, 3:5] *= torch.exp(0.1 * torch.randn(n, 2, generator=gen))
    anchors[:, 6] += 0.2 * torch.randn(n, generator=gen)
    if scores_kind == 'random':
        scores = torch.rand(n, generator=gen)
    else:
        objects = torch.rand(20, 2, generator=gen) * torch.tensor([70., 80.]) - \
            torch.tensor([0., 40.])
        dist = torch.cdist(anchors[:, :2], objects).min(1)[0]
        scores = torch.sigmoid(4 - dist + 0.5 * torch.randn(n, generator=gen))
    scores, top = scores.topk(min(num, n))
    boxes = xywhr2xyxyr(LiDARInstance3DBoxes(anchors[top]).bev)
    return boxes.to(device), scores.to(device)


def run_setting(args, num: int, scores_kind: str) -> Dict:
    from mmdet3d_scaling.patches.speed.nms_bev import nms_bev as patch
    mmdet3d_nms_bev = patch.original  # mmdet3d's own, whether or not the patch is on
    samples = [proposals(num, seed, scores_kind, args.device)
               for seed in range(args.batch)]
    thr = args.thr
    theirs = [mmdet3d_nms_bev(b, s, thr) for b, s in samples]
    ours = [nms_bev(b, s, thr) for b, s in samples]
    equal = all(torch.equal(a, b) for a, b in zip(ours, theirs))
    boxes = torch.cat([b for b, _ in samples])
    scores = torch.cat([s for _, s in samples])
    groups = torch.cat([torch.full((len(s),), i, device=args.device)
                        for i, (_, s) in enumerate(samples)])
    offsets = [0]
    for _, s in samples[:-1]:
        offsets.append(offsets[-1] + len(s))
    grouped = nms_bev(boxes, scores, thr, groups=groups)
    equal_grouped = torch.equal(grouped, torch.cat(
        [k + o for k, o in zip(theirs, offsets)]))
    if not (equal and equal_grouped):
        raise SystemExit(f'kept indices differ from mmdet3d at boxes={num} '
                         f'scores={scores_kind}: per sample equal={equal}, grouped '
                         f'equal={equal_grouped}')
    row = dict(boxes=num, batch=args.batch, scores=scores_kind, thr=thr,
               kept_per_sample=statistics.mean(len(k) for k in theirs), equal=True)
    row['mmdet3d_s'] = timed(lambda: [mmdet3d_nms_bev(b, s, thr) for b, s in samples],
                             args.device, args.repeats)
    row['ours_s'] = timed(lambda: [nms_bev(b, s, thr) for b, s in samples],
                          args.device, args.repeats)
    row['ours_grouped_s'] = timed(lambda: nms_bev(boxes, scores, thr, groups=groups),
                                  args.device, args.repeats)
    row['speedup'] = row['mmdet3d_s'] / row['ours_s']
    row['speedup_grouped'] = row['mmdet3d_s'] / row['ours_grouped_s']
    return row


def main(argv: List[str] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--device', choices=('cpu', 'cuda'), default='cuda')
    p.add_argument('--boxes', type=int, nargs='+', default=[9000, 1024],
                   help='boxes a sample (default: PV-RCNN training and testing)')
    p.add_argument('--batch', type=int, default=8, help='samples (NMS calls) a step')
    p.add_argument('--thr', type=float, default=0.8, help='IoU threshold (training 0.8)')
    p.add_argument('--scores', nargs='+', default=['random', 'objects'],
                   choices=('random', 'objects'))
    p.add_argument('--repeats', type=int, default=5)
    p.add_argument('--threads', type=int, default=None, help='torch CPU threads')
    p.add_argument('--out', help='write the results as JSON here')
    args = p.parse_args(argv)
    if args.device == 'cuda' and not torch.cuda.is_available():
        raise SystemExit('--device cuda: torch sees no CUDA device; use --device cpu')
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = [run_setting(args, num, kind) for num in args.boxes for kind in args.scores]
    head = ('boxes', 'scores', 'batch', 'kept', 'mmdet3d ms', 'ours ms', 'grouped ms',
            'speedup', 'grouped')
    print(' | '.join(head))
    for r in rows:
        print(' | '.join([str(r['boxes']), r['scores'], str(r['batch']),
                          f"{r['kept_per_sample']:.0f}", f"{1e3 * r['mmdet3d_s']:.1f}",
                          f"{1e3 * r['ours_s']:.1f}", f"{1e3 * r['ours_grouped_s']:.1f}",
                          f"{r['speedup']:.1f}x", f"{r['speedup_grouped']:.1f}x"]))
    if args.out:
        device = (torch.cuda.get_device_name() if args.device == 'cuda'
                  else platform.processor() or platform.machine())
        with open(args.out, 'w', encoding='utf-8') as f:
            json.dump(dict(device=args.device, device_name=device,
                           torch=torch.__version__, threads=torch.get_num_threads(),
                           command=' '.join(sys.argv), rows=rows), f, indent=1)
        print(f'wrote {args.out}')


if __name__ == '__main__':
    main()
