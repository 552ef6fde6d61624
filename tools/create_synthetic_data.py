"""Write a synthetic dataset in a format that mmdet3d 1.4 reads.

    python tools/create_synthetic_data.py kitti --out data/synthetic_kitti \
        --train-frames 200 --val-frames 50 --seed 0
    python tools/create_synthetic_data.py nuscenes --out data/synthetic_nuscenes \
        --train-frames 120 --val-frames 40 --seed 0

One subcommand per dataset format; each has its own ``add_<name>_parser`` below.
Every subcommand refuses a non-empty ``--out`` (it may hold a real dataset) unless
``--overwrite`` is given, and leaves a marker file (``.synthetic_<format>``) in the
folder it writes; exit status 1 and the reason on stderr when it refuses.
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
    parser.add_argument('--overwrite', action='store_true',
                        help='write into a non-empty --out (files of the same names are '
                        'replaced); without it a non-empty --out is refused')


def run_kitti(args: argparse.Namespace) -> dict:
    from mmdet3d_scaling.datasets.synthetic.kitti import write_kitti
    return write_kitti(args.out, args.train_frames, args.val_frames, seed=args.seed,
                       progress=not args.no_progress, overwrite=args.overwrite)


def add_kitti_parser(subparsers) -> None:
    parser = subparsers.add_parser('kitti', help="KITTI layout (mmdet3d's KittiDataset)")
    _common(parser, 'data/synthetic_kitti')
    parser.set_defaults(func=run_kitti)


def run_nuscenes(args: argparse.Namespace) -> dict:
    from mmdet3d_scaling.datasets.synthetic.nuscenes import (NuScenesSyntheticConfig,
                                                             generate_nuscenes)
    cfg = NuScenesSyntheticConfig(
        out_dir=args.out, train_frames=args.train_frames, val_frames=args.val_frames,
        seed=args.seed, version=args.version, samples_per_scene=args.samples_per_scene,
        sweeps=args.sweeps, image_size=(900, 1600) if args.full_res else tuple(args.image_size),
        objects_per_sample=args.objects, max_range=args.max_range,
        gt_database=not args.no_gt_database, overwrite=args.overwrite)
    return generate_nuscenes(cfg, progress=not args.no_progress, workers=args.workers)


def add_nuscenes_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        'nuscenes', help="nuScenes layout: LiDAR + sweeps, 6 cameras, v2 infos and the "
        "database tables (mmdet3d's NuScenesDataset and NuScenesMetric)")
    _common(parser, 'data/synthetic_nuscenes')
    parser.set_defaults(train_frames=120, val_frames=40)
    parser.add_argument('--version', default='v1.0-trainval',
                        choices=['v1.0-trainval', 'v1.0-mini'],
                        help='table version; v1.0-trainval is what NuScenesDataset assumes')
    parser.add_argument('--samples-per-scene', type=int, default=10,
                        help='key frames per scene (real nuScenes: ~40)')
    parser.add_argument('--sweeps', type=int, default=3,
                        help='non-key LiDAR sweeps before each key frame (0-9)')
    parser.add_argument('--image-size', type=int, nargs=2, default=[256, 704],
                        metavar=('H', 'W'), help='camera image height and width')
    parser.add_argument('--full-res', action='store_true',
                        help='real nuScenes images, 900 x 1600 (overrides --image-size)')
    parser.add_argument('--objects', type=int, default=20,
                        help='annotated objects around the car per key frame (about)')
    parser.add_argument('--max-range', type=float, default=None,
                        help='place objects at most this many metres from the car '
                        '(default: the evaluation class ranges, 28-48 m)')
    parser.add_argument('--no-gt-database', action='store_true',
                        help='skip the ObjectSample database (nuscenes_dbinfos_train.pkl)')
    parser.add_argument('--workers', type=int, default=1,
                        help='processes writing scenes in parallel (same output)')
    parser.set_defaults(func=run_nuscenes)


#: subcommand name -> function adding its parser (a new format: add one entry)
SUBCOMMANDS: Dict[str, Callable] = {'kitti': add_kitti_parser,
                                    'nuscenes': add_nuscenes_parser}


def main(argv: Optional[List[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    subparsers = parser.add_subparsers(dest='dataset', required=True,
                                       help='dataset format to write')
    for add_parser in SUBCOMMANDS.values():
        add_parser(subparsers)
    args = parser.parse_args(argv)
    summary = args.func(args)
    print(f'wrote {args.dataset} to {args.out}: {summary}')
    return summary


if __name__ == '__main__':
    try:
        main()
    except (FileExistsError, NotADirectoryError) as err:  # a refused --out: no traceback
        sys.exit(f'create_synthetic_data.py: error: {err}')
