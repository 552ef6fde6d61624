"""Workarounds for third-party defects, in one place.

Each module here fixes one upstream defect, names the upstream versions it is for, and
exposes an idempotent ``apply()``; importing this package applies them all, except those
named in ``$MMDET3D_SCALING_SKIP_SHIMS`` (comma-separated module names, e.g.
``max_iou_assigner``; mmcv_ops always applies).

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
| max_iou_assigner    | mmdet 3.3.0                  | MaxIoUAssigner waits on the GPU once per     |
|                     |                              | ground truth: same result, no host read      |
| instance_data_index | mmengine 0.10.x              | InstanceData[mask] waits on the GPU once per |
|                     |                              | field, slices boxes one by one: one wait     |
| pseudo_sampler      | mmdet3d 1.4.0                | PseudoSampler waits on the GPU four times a  |
|                     |                              | call: same indices, one wait                 |
| grouping_backward   | mmcv 2.1.0                   | stacked grouping's backward: per-channel     |
|                     |                              | atomics, 30 % of PV-RCNN's GPU time; one     |
|                     |                              | index_add_ of feature rows instead           |
| rpn_proposal_nms    | mmdet3d 1.4.0                | PartA2RPNHead's proposal NMS waits on the    |
|                     |                              | GPU six times a sample: one wait             |
| stack_query_group   | mmdet3d 1.4.0                | StackQueryAndGroup asserts on GPU sums and   |
|                     |                              | mask-assigns: checks queued, masked_fill     |
| roi_assign          | mmdet3d 1.4.0                | PV-RCNN's per-class RoI assignment waits ~18 |
|                     |                              | times a sample: one wait a batch             |
| anchor_targets      | mmdet3d 1.4.0                | anchor heads' per-class targets wait ~9      |
|                     |                              | times a sample: whole batch, one wait        |
| iou_piecewise_      | mmdet3d 1.4.0                | IoUNegPiecewiseSampler waits ~5 times a      |
|   sampler           |                              | call: one wait, the same random draws        |
| foreground_seg_     | mmdet3d 1.4.0                | PV-RCNN's point-head targets wait per        |
|   targets           |                              | sample: one wait a batch                     |
| rcnn_bbox_targets   | mmdet3d 1.4.0                | PV-RCNN's box-head targets wait 2-5 times a  |
|                     |                              | sample: torch.where, no wait                 |
"""
import os

from . import mmcv_ops

mmcv_ops.apply()  # first: the other shims import mmdet3d, which needs the ops

from . import amp_cpu, checkpoint, dist_cpu, point_loading, runner_config, spconv_cpu  # noqa: E402,E501
from . import instance_data_index, kitti_eval_cpu, max_iou_assigner, nuscenes_metric  # noqa: E402,E501
from . import grouping_backward, point_ops_cpu, pseudo_sampler, rpn_proposal_nms  # noqa: E402,E501
from . import anchor_targets, foreground_seg_targets, iou_piecewise_sampler  # noqa: E402
from . import rcnn_bbox_targets, roi_assign, stack_query_group  # noqa: E402

# shims by module name, the name $MMDET3D_SCALING_SKIP_SHIMS uses
_SHIMS = {shim.__name__.rsplit('.', 1)[-1]: shim for shim in (
    checkpoint, spconv_cpu, runner_config, point_loading, amp_cpu, dist_cpu,
    kitti_eval_cpu, nuscenes_metric, point_ops_cpu, max_iou_assigner,
    instance_data_index, pseudo_sampler, grouping_backward, rpn_proposal_nms,
    stack_query_group, iou_piecewise_sampler, roi_assign, anchor_targets,
    foreground_seg_targets, rcnn_bbox_targets)}
SKIP_ENV = 'MMDET3D_SCALING_SKIP_SHIMS'


def _skipped() -> set:
    """Shims named in $MMDET3D_SCALING_SKIP_SHIMS (comma-separated) stay unapplied."""
    names = {n.strip() for n in os.environ.get(SKIP_ENV, '').split(',') if n.strip()}
    unknown = sorted(names - set(_SHIMS))
    if unknown:
        raise ValueError(f'{SKIP_ENV}={os.environ[SKIP_ENV]!r} names unknown shim(s) '
                         f'{unknown}; known: {", ".join(sorted(_SHIMS))}')
    return names


_SKIPPED = _skipped()
for _name, _shim in _SHIMS.items():
    if _name not in _SKIPPED:
        _shim.apply()

__all__ = ['checkpoint', 'spconv_cpu', 'runner_config', 'point_loading', 'mmcv_ops',
           'amp_cpu', 'dist_cpu', 'kitti_eval_cpu', 'nuscenes_metric', 'point_ops_cpu',
           'max_iou_assigner', 'instance_data_index', 'pseudo_sampler', 'grouping_backward',
           'rpn_proposal_nms', 'stack_query_group', 'roi_assign', 'anchor_targets',
           'iou_piecewise_sampler', 'foreground_seg_targets', 'rcnn_bbox_targets']
