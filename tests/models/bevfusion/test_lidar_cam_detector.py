"""The LiDAR-camera BEVFusion detector on the CPU: a reduced model with the official
structure (Swin, GeneralizedLSSFPN, DepthLSSTransform, ConvFuser on top of the reduced
LiDAR model of ``common.py``), two cameras; train and predict steps, and the memory
options (checkpointing, lean and deterministic pooling) leave the losses unchanged."""
import copy

import pytest
import torch
from mmengine.optim import OptimWrapper

from .common import build, camera_batch, camera_cfg

pytest.importorskip('spconv.pytorch')  # the CPU sparse conv


@pytest.mark.slow
def test_train_step_updates_camera_and_lidar_parameters():
    torch.manual_seed(0)
    model = build(camera_cfg()).train()
    optim = OptimWrapper(torch.optim.AdamW(model.parameters(), lr=1e-3))
    before = {n: p.detach().clone() for n, p in model.named_parameters()
              if p.requires_grad}
    log_vars = model.train_step(camera_batch(), optim)
    assert torch.isfinite(log_vars['loss']) and log_vars['loss'] > 0
    params = dict(model.named_parameters())
    unchanged = [n for n, p in before.items() if torch.equal(params[n], p)]
    assert not unchanged, unchanged
    assert any(n.startswith('view_transform.depthnet') for n in before)
    assert any(n.startswith('img_backbone.') for n in before)


def test_predict_step_with_cameras():
    model = build(camera_cfg()).eval()
    with torch.no_grad():
        results = model.test_step(camera_batch(seed=1))
    assert len(results) == 2
    for res in results:
        assert res.pred_instances_3d.bboxes_3d.tensor.shape[-1] == 9


def losses_of(cfg: dict, state: dict, batch: dict) -> dict:
    model = build(cfg).train()
    model.load_state_dict(state)
    data = model.data_preprocessor(copy.deepcopy(batch), True)
    torch.manual_seed(123)  # same dropout masks in the head
    losses = model(**data, mode='loss')
    return {k: float(v) for k, v in losses.items() if 'loss' in k}


@pytest.mark.slow
def test_memory_options_leave_losses_unchanged():
    torch.manual_seed(0)
    plain_cfg = camera_cfg()
    state = build(plain_cfg).state_dict()
    saver_cfg = camera_cfg(with_cp=True, memory_efficient=True, deterministic=True)
    saver_cfg['img_backbone']['with_cp'] = True
    saver_cfg['img_neck']['with_cp'] = True
    batch = camera_batch(seed=2)
    plain = losses_of(plain_cfg, state, batch)
    saver = losses_of(saver_cfg, state, batch)
    assert plain.keys() == saver.keys()
    for key in plain:
        assert saver[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-5), key
