#!/usr/bin/env python
"""BEVFusion's BEV pooling paths: time (forward + backward), peak memory, error vs fp64.

The command line of :mod:`mmdet3d_scaling.diagnostics.bev_pool_benchmark`, whose
docstring says what it measures and how to run it.
"""
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from mmdet3d_scaling.diagnostics.bev_pool_benchmark import main  # noqa: E402

if __name__ == '__main__':
    sys.exit(main())
