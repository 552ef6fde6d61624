#!/usr/bin/env python
"""Parity benchmark: does one config train to the same model on any process count?

Command line of :mod:`mmdet3d_scaling.diagnostics.parity_cli` (options: ``--help``;
outputs and arrangements: docs/parity.md). Example (the CPU demo, effective batch
4 = 1 x 4)::

    python tools/benchmark_parity.py configs/demo/pointpillars_synthetic_kitti_cpu.py \
        --batch 1 --accumulation 4 --nproc 2 --seeds 0,1,2 --iters 150 \
        --data-root work_dirs/parity_data/synthetic_kitti --out work_dirs/parity_demo
"""
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from mmdet3d_scaling.diagnostics.parity_cli import main  # noqa: E402

if __name__ == '__main__':
    sys.exit(main())
