"""Every change the plugin makes to upstream code, as declared patches (one a module).

``import mmdet3d_scaling`` applies the ``fixes`` set, and the ``cpu`` set where torch has
no CUDA; a config selects more with ``patches = ['speed']`` (``ScalingRunner`` applies it
and prints the table). ``python -c "import mmdet3d_scaling.compat as c;
print(c.patching.table())"`` lists them; ``docs/compat.md`` explains each one.

| patch                  | kind  | replaces                                               |
|------------------------|-------|--------------------------------------------------------|
| checkpoint             | fixes | mmengine's local / http(s) checkpoint loaders          |
| checkpoint_save        | fixes | ``save_checkpoint``: local files by temp + rename      |
| point_loading          | fixes | mmdet3d's ``LoadPoints*._load_points``                 |
| info_files             | fixes | info-file ``load`` of datasets, metrics, db sampler    |
| nuscenes_metric        | fixes | ``NuScenesMetric._evaluate_single``                    |
| numpy_removed_apis     | fixes | numpy >= 2.5 removals used by mmdet3d's KITTI eval     |
| runner_handoff         | fixes | ``Runner.from_cfg`` (configs with plugin keys)         |
| config_scope           | fixes | ``Config._get_cfg_path``, mmengine.hub's package lookup |
| spconv_cpu             | cpu   | spconv's CUDA stream lookup, CPU sparse-conv dtype     |
| amp_cpu                | cpu   | ``AmpOptimWrapper.__init__`` / ``optim_context``       |
| dist_cpu               | cpu   | mmengine's ``_init_dist_*`` (no ``cuda.set_device``)   |
| kitti_eval_cpu         | cpu   | mmdet3d's numba-CUDA rotated IoU module                |
| point_ops_cpu          | cpu   | FPS, ball query, grouping, points_in_boxes bindings    |
| max_iou_assigner ...   | speed | PV-RCNN / anchor-head host reads and grouping backward |

``mmcv_ops`` is a check, not a patch: it fails at import, with the fix, when mmcv has no
compiled ops.
"""
from . import mmcv_ops

mmcv_ops.check()  # first: the patch modules import mmdet3d, which needs the ops

from . import patching  # noqa: E402
# fixes
from . import checkpoint, point_loading, nuscenes_metric, numpy_removed_apis  # noqa: E402,F401,E501
from . import checkpoint_save  # noqa: E402,F401
from . import info_files  # noqa: E402,F401
from . import runner_handoff  # noqa: E402,F401
from . import config_scope  # noqa: E402,F401
# cpu
from . import spconv_cpu, amp_cpu, dist_cpu, kitti_eval_cpu, point_ops_cpu  # noqa: E402,F401,E501
# speed (grouping_backward after point_ops_cpu: it wraps whatever grouping is bound)
from . import max_iou_assigner, instance_data_index, pseudo_sampler  # noqa: E402,F401
from . import grouping_backward, rpn_proposal_nms, stack_query_group  # noqa: E402,F401
from . import iou_piecewise_sampler, roi_assign, anchor_targets  # noqa: E402,F401
from . import foreground_seg_targets, rcnn_bbox_targets  # noqa: E402,F401

__all__ = ['patching', 'mmcv_ops']
