"""PV-RCNN's own heads, built from the plugin's CPU PV-RCNN config (for shim tests)."""
from mmengine.config import Config

CONFIG = 'configs/pv_rcnn/pv_rcnn_synthetic_kitti_cpu.py'


def build_pv_rcnn_head(head: str, stage: str):
    """``model[head]`` with ``train_cfg[stage]`` / ``test_cfg[stage]``, e.g.
    ``('rpn_head', 'rpn')`` or ``('roi_head', 'rcnn')``."""
    from mmdet3d.registry import MODELS
    from mmdet3d.utils import register_all_modules
    register_all_modules()
    model = Config.fromfile(CONFIG).model
    return MODELS.build(dict(model[head], train_cfg=model.train_cfg[stage],
                             test_cfg=model.test_cfg[stage]))
