#!/usr/bin/env python
"""BEVFusion LiDAR-only train step at the official sizes: time and peak memory.

The command line of :mod:`mmdet3d_scaling.diagnostics.bevfusion_lidar_benchmark`, whose
docstring says what it measures and how to run it.
"""
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from mmdet3d_scaling.diagnostics.bevfusion_lidar_benchmark import main  # noqa: E402

if __name__ == '__main__':
    sys.exit(main())
