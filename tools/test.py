"""Test and evaluate a 3D detector: mmdet3d's tools/test.py command line.

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--launcher auto] ...
    bash tools/dist_test.sh CONFIG CHECKPOINT NUM_GPUS [args]
"""
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

import mmdet3d_scaling  # noqa: E402,F401
from mmdet3d_scaling.engine.cli import test_main  # noqa: E402

if __name__ == '__main__':
    test_main()
