"""Fingerprint of a generated synthetic KITTI set: does this machine generate the same data?

    python tools/analysis/synthetic_fingerprint.py                     # 6 frames, seed 0
    python tools/analysis/synthetic_fingerprint.py --frames 200 --val-frames 50 --out fp.json

Generates the set into a temp folder and prints one SHA-256 per kind of content and one
over all of them (``mmdet3d_scaling.datasets.synthetic.fingerprint`` says what is
hashed). Run it on two machines, or on one with other CPU kernels, e.g.
``NPY_DISABLE_CPU_FEATURES="AVX512F AVX512_SKX" OPENBLAS_CORETYPE=Haswell``, and compare.
"""
import argparse
import json
import os.path as osp
import sys

import numpy as np

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

from mmdet3d_scaling.datasets.synthetic.fingerprint import generate_and_fingerprint  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--frames', type=int, default=6, help='train frames')
    parser.add_argument('--val-frames', type=int, default=2, help='val frames')
    parser.add_argument('--seed', type=int, default=0,
                        help='generator seed of the fingerprinted set (default 0)')
    parser.add_argument('--out', help='also write the fingerprint as JSON here')
    args = parser.parse_args()
    result = generate_and_fingerprint(args.frames, args.seed, args.val_frames)
    result.update(frames=args.frames, val_frames=args.val_frames, seed=args.seed,
                  numpy=np.__version__)
    for key, value in result.items():
        print(f'{key:10s} {value}')
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(result, f, indent=1)


if __name__ == '__main__':
    main()
