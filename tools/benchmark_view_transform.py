#!/usr/bin/env python
"""BEVFusion's DepthLSSTransform: time and peak memory with and without its memory options.

The command line of :mod:`mmdet3d_scaling.diagnostics.view_transform_benchmark`, whose
docstring says what it measures and how to run it.
"""
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from mmdet3d_scaling.diagnostics.view_transform_benchmark import main  # noqa: E402

if __name__ == '__main__':
    sys.exit(main())
