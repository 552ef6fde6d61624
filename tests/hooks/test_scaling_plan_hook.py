"""ScalingPlanHook in one process: the plan in checkpoints, conversion on resume.

The two-process resume (1 GPU with accumulation -> 2 GPUs) is in
``tests/parallel/test_ddp_runner.py``; here the per-GPU batch changes instead.
"""
import json
import os.path as osp

import pytest
import torch
from mmengine.runner import Runner

import mmdet3d_scaling  # noqa: F401
from tests.parallel.dist_parts import params_of, toy_cfg


def _train(work_dir, name, **kw) -> Runner:
    runner = Runner.from_cfg(toy_cfg(work_dir, name=name, **kw))
    runner.train()
    return runner


@pytest.mark.slow
def test_plan_is_saved_and_resume_converts_iterations(tmp_path):
    out = str(tmp_path)
    ref = _train(osp.join(out, 'ref'), 'ref', scaling=dict(total_batch_size=4),
                 checkpoint_interval=4, record=osp.join(out, 'ref.json'))
    ckpt = osp.join(out, 'ref', 'iter_8.pth')
    meta = torch.load(ckpt, map_location='cpu', weights_only=False)['meta']
    assert meta['scaling_plan']['accumulation'] == 2
    assert meta['samples_seen'] == 16
    # same total batch 4, now 1 per micro-batch x 4 accumulation: iteration 8 -> 16
    resumed = _train(osp.join(out, 'resumed'), 'resumed', load_from=ckpt, resume=True,
                     trusted_checkpoints=[ckpt], record=osp.join(out, 'resumed.json'),
                     scaling=dict(total_batch_size=4, per_gpu_batch_size=1))
    hook = next(h for h in resumed.hooks if type(h).__name__ == 'ScalingPlanHook')
    assert (hook.conversion['old_iter'], hook.conversion['new_iter']) == (8, 16)
    with open(osp.join(out, 'ref.json')) as f:
        ref_lrs = json.load(f)['lrs']
    with open(osp.join(out, 'resumed.json')) as f:
        record = json.load(f)
    assert record['start_iter'] == 16
    assert record['lrs']['16'] == ref_lrs['8']
    assert resumed.iter == 24  # 6 optimizer steps of 4 micro-batches
    diff = max(max(abs(a - b) for a, b in zip(x, y)) for x, y in zip(
        params_of(resumed.model).values(), params_of(ref.model).values()))
    assert diff <= 1e-5


@pytest.mark.slow
def test_loading_weights_only_converts_nothing(tmp_path):
    out = str(tmp_path)
    _train(osp.join(out, 'a'), 'a', scaling=dict(total_batch_size=4))
    ckpt = osp.join(out, 'a', 'iter_12.pth')
    runner = _train(osp.join(out, 'b'), 'b', load_from=ckpt, trusted_checkpoints=[ckpt],
                    scaling=dict(total_batch_size=4, per_gpu_batch_size=1), max_iters=1)
    hook = next(h for h in runner.hooks if type(h).__name__ == 'ScalingPlanHook')
    assert hook.conversion is None and runner.iter == 4


@pytest.mark.slow
def test_new_lr_scale_alone_is_converted_on_resume(tmp_path):
    # same split (1 GPU x 2 x 2), only the LR the config was tuned for changes: the
    # checkpoint's LR (x 1) must not survive the resume (x 2 now)
    out = str(tmp_path)
    _train(osp.join(out, 'a'), 'a', scaling=dict(total_batch_size=4),
           checkpoint_interval=4)
    ckpt = osp.join(out, 'a', 'iter_8.pth')
    fresh = _train(osp.join(out, 'fresh'), 'fresh', max_iters=4,
                   scaling=dict(total_batch_size=4, base_batch_size=2))
    resumed = Runner.from_cfg(toy_cfg(
        osp.join(out, 'r'), name='r', load_from=ckpt, resume=True,
        trusted_checkpoints=[ckpt], scaling=dict(total_batch_size=4, base_batch_size=2)))
    resumed.train()
    hook = next(h for h in resumed.hooks if type(h).__name__ == 'ScalingPlanHook')
    assert (hook.conversion['old_iter'], hook.conversion['new_iter']) == (8, 8)
    # MultiStepLR milestone 3 passed: both at 0.1 x gamma, the fresh run at its end
    group = resumed.optim_wrapper.optimizer.param_groups[0]
    ref = fresh.optim_wrapper.optimizer.param_groups[0]
    assert group['initial_lr'] == ref['initial_lr'] == pytest.approx(0.1)
    assert group['lr'] == pytest.approx(ref['lr'])
