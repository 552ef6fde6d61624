"""PV-RCNN's own heads, built from the plugin's CPU PV-RCNN config, and the comparison
of sampling results (for patch tests)."""
import torch
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


def assert_same_sampling_result(ours, theirs, required: set) -> None:
    """Every tensor field of two ``SamplingResult``s equal (dtype, shape, values), and
    the ``required`` fields among them."""
    fields = {k for k, v in vars(theirs).items() if isinstance(v, torch.Tensor)}
    assert fields == {k for k, v in vars(ours).items() if isinstance(v, torch.Tensor)}
    assert required <= fields
    for k in sorted(fields):
        x, y = getattr(ours, k), getattr(theirs, k)
        assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), k
