#!/usr/bin/env python
"""Parity benchmark: does one config train to the same model on any process count?

Trains CONFIG in several arrangements of the same effective batch T = B x K, each with
several seeds, through tools/train.py (tools/dist_train.sh for N processes) and
tools/test.py, and writes under --out: ``parity.json`` (every run's overrides, seed,
metrics, loss per optimizer step, wall time; per arrangement mean / std / min / max),
``parity.png`` (loss curves, band = seed range) and ``runs/<arrangement>/seed<S>/``.
Arrangements: ``1proc_bB_accK`` (reference), ``1proc_bT``, ``Nproc_bB_acc{K/N}`` for each
--nproc, and with --stock the config as written. Library:
:mod:`mmdet3d_scaling.diagnostics.parity`; docs/parity.md.

Example (the CPU demo, effective batch 4 = 1 x 4)::

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
