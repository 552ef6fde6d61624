"""Train a 3D detector: mmdet3d's tools/train.py command line, plus --launcher auto.

    python tools/train.py CONFIG [--work-dir DIR] [--amp] [--resume [CKPT]] ...
    bash tools/dist_train.sh CONFIG NUM_GPUS [args]
"""
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

import mmdet3d_scaling  # noqa: E402,F401  (registers the plugin, applies patches)
from mmdet3d_scaling.engine.cli import train_main  # noqa: E402

if __name__ == '__main__':
    train_main()
