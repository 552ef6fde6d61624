"""Workarounds for third-party defects, in one place.

Each module here fixes one upstream defect, names the upstream versions it is for, and
exposes an idempotent ``apply()``; importing this package applies them all.

| module              | upstream                     | defect                                       |
|---------------------|------------------------------|----------------------------------------------|
| checkpoint          | mmengine 0.10.x, torch>=2.6  | torch.load without weights_only              |
| spconv_cpu          | spconv 2.3.x, CPU-only torch | backward asks CUDA for the current stream    |
| runner_config       | mmengine 0.10.x              | unknown config keys (optimizer_config, fp16, |
|                     |                              | scaling) silently ignored by Runner.from_cfg |
| point_loading       | mmdet3d 1.4.0                | a corrupt point file fails without its name  |
| mmcv_ops            | mmcv 2.x                     | missing compiled ops fail late, without fix  |
| amp_cpu             | mmengine 0.10.x              | AmpOptimWrapper asserts a GPU; CPU-only runs |
|                     |                              | degrade to bf16 autocast / fp32, logged      |
| dist_cpu            | mmengine 0.10.x, CPU torch   | init_dist calls torch.cuda.set_device: gloo  |
|                     |                              | runs under torchrun/srun/mpirun die at start |
| kitti_eval_cpu      | mmdet3d 1.4.0                | KITTI metric needs a CUDA driver (numba.cuda |
|                     |                              | rotated IoU): CPU twin when there is none    |
| nuscenes_metric     | mmdet3d 1.4.0, devkit 1.x    | a result without boxes crashes the devkit:   |
|                     |                              | report mAP = NDS = 0 instead                 |
| point_ops_cpu       | mmcv 2.1.0                   | FPS, stacked ball query / grouping and       |
|                     |                              | points_in_boxes_part are CUDA-only: PV-RCNN  |
|                     |                              | gets PyTorch twins for CPU tensors           |
"""
from . import mmcv_ops

mmcv_ops.apply()  # first: the other shims import mmdet3d, which needs the ops

from . import amp_cpu, checkpoint, dist_cpu, point_loading, runner_config, spconv_cpu  # noqa: E402,E501
from . import kitti_eval_cpu, nuscenes_metric, point_ops_cpu  # noqa: E402

for _shim in (checkpoint, spconv_cpu, runner_config, point_loading, amp_cpu, dist_cpu,
              kitti_eval_cpu, nuscenes_metric, point_ops_cpu):
    _shim.apply()

__all__ = ['checkpoint', 'spconv_cpu', 'runner_config', 'point_loading', 'mmcv_ops',
           'amp_cpu', 'dist_cpu', 'kitti_eval_cpu', 'nuscenes_metric', 'point_ops_cpu']
