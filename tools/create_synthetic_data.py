"""Write a synthetic dataset in a format that mmdet3d 1.4 reads.

    python tools/create_synthetic_data.py kitti --out data/synthetic_kitti \
        --train-frames 200 --val-frames 50 --seed 0

One subcommand per dataset format; each has its own ``add_<name>_parser`` below.
"""
import argparse
import os.path as osp
import sys
from typing import Callable, Dict, List, Optional

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))


def _common(parser: argparse.ArgumentParser, default_out: str) -> None:
    parser.add_argument('--out', default=default_out, help='dataset root to write')
    parser.add_argument('--train-frames', type=int, default=200, help='train split size')
    parser.add_argument('--val-frames', type=int, default=50, help='val split size')
    parser.add_argument('--seed', type=int, default=0, help='same seed -> same bytes')
    parser.add_argument('--no-progress', action='store_true', help='no progress bar')


def run_kitti(args: argparse.Namespace) -> dict:
    from mmdet3d_scaling.datasets.synthetic.kitti import write_kitti
    return write_kitti(args.out, args.train_frames, args.val_frames, seed=args.seed,
                       progress=not args.no_progress)


def add_kitti_parser(subparsers) -> None:
    parser = subparsers.add_parser('kitti', help="KITTI layout (mmdet3d's KittiDataset)")
    _common(parser, 'data/synthetic_kitti')
    parser.set_defaults(func=run_kitti)


#: subcommand name -> function adding its parser (a new format: add one entry)
SUBCOMMANDS: Dict[str, Callable] = {'kitti': add_kitti_parser}


def main(argv: Optional[List[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    subparsers = parser.add_subparsers(dest='dataset', required=True)
    for add_parser in SUBCOMMANDS.values():
        add_parser(subparsers)
    args = parser.parse_args(argv)
    summary = args.func(args)
    print(f'wrote {args.dataset} to {args.out}: {summary}')
    return summary


if __name__ == '__main__':
    main()
