"""The scaling recipe: plan arithmetic, errors, and what it writes into configs."""
import copy
import math
import os.path as osp

import pytest
from mmengine.config import Config
from mmengine.runner import Runner

import mmdet3d_scaling  # noqa: F401
from mmdet3d_scaling.config.preparation import prepare_config
from mmdet3d_scaling.config.plan_writer import apply_plan, recorded_plan
from mmdet3d_scaling.config.scaling_plan import (ScalingPlan, format_plan, make_plan,
                                                  plan_hint)
from tests.parallel.dist_parts import toy_cfg

MMDET3D_CONFIGS = osp.join(osp.dirname(__import__('mmdet3d').__file__), '.mim', 'configs')


# ------------------------------------------------------------------------ arithmetic
@pytest.mark.parametrize('kwargs,expected', [
    (dict(total_batch_size=32, world_size=8), (4, 1)),
    (dict(total_batch_size=32, world_size=1, max_per_gpu_batch=4), (4, 8)),
    (dict(total_batch_size=32, world_size=2, max_per_gpu_batch=4), (4, 4)),
    (dict(total_batch_size=32, world_size=4, per_gpu_batch=2), (2, 4)),
    (dict(total_batch_size=24, world_size=4, max_per_gpu_batch=4), (3, 2)),
    (dict(total_batch_size=28, world_size=4, max_per_gpu_batch=4), (1, 7)),
])
def test_plan_arithmetic(kwargs, expected):
    plan = make_plan(**kwargs)
    assert (plan.per_gpu_batch, plan.accumulation) == expected
    assert plan.world_size * plan.per_gpu_batch * plan.accumulation == plan.total_batch


def test_lr_scaling_rules():
    assert make_plan(64, 8, base_batch_size=16).lr_scale == 4
    assert make_plan(64, 8, base_batch_size=16, lr_scaling='sqrt').lr_scale == 2
    assert make_plan(64, 8, base_batch_size=16, lr_scaling='none').lr_scale == 1
    assert make_plan(64, 8).lr_scale == 1  # no base: the LR is for this total
    assert math.isclose(make_plan(8, 2, base_batch_size=32, lr_scaling='sqrt').lr_scale, 0.5)


@pytest.mark.parametrize('kwargs,match', [
    (dict(total_batch_size=30, world_size=4), r'total_batch_size=30.*4 GPUs.*28, 32'),
    (dict(total_batch_size=2, world_size=4), r'total_batch_size=2 .*Nearest valid totals: 4'),
    (dict(total_batch_size=32, world_size=4, per_gpu_batch=3),
     r'8 samples per GPU.*per_gpu_batch_size=3.*24, 36.*1, 2, 4, 8'),
    (dict(total_batch_size=32, world_size=4, per_gpu_batch=8, max_per_gpu_batch=4),
     r'per_gpu_batch_size=8 is above the per-GPU cap max_per_gpu_batch_size=4'),
    (dict(total_batch_size=32, world_size=4, lr_scaling='cubic'), r"lr_scaling='cubic'"),
    (dict(total_batch_size=0, world_size=4), r'total_batch_size must be a positive'),
    (dict(total_batch_size=8, world_size=2, base_batch_size=2.5), r'base_batch_size'),
])
def test_impossible_plans_are_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_plan(**kwargs)


def test_hint_for_a_poor_split_and_the_table():
    plan = make_plan(28, 4, max_per_gpu_batch=4)
    assert '16, 32' in plan_hint(plan, 4)
    assert plan_hint(make_plan(32, 4, max_per_gpu_batch=4), 4) is None
    table = format_plan(make_plan(32, 2, max_per_gpu_batch=4, base_batch_size=16))
    assert '32 = 2 x 4 x 4' in table and 'linear: x 2' in table
    plan = make_plan(32, 2, max_per_gpu_batch=4)
    assert ScalingPlan.from_dict(plan.to_dict()) == plan


# --------------------------------------------------------------- applying to configs
def test_apply_plan_on_a_stock_mmdet3d_config():
    cfg = Config.fromfile(osp.join(
        MMDET3D_CONFIGS, 'pointpillars', 'pointpillars_hv_secfpn_8xb6-160e_kitti-3d-3class.py'))
    lr = cfg.optim_wrapper.optimizer.lr
    lr_eta = [s.eta_min for s in cfg.param_scheduler if s.type == 'CosineAnnealingLR']
    mom_eta = [s.eta_min for s in cfg.param_scheduler if 'Momentum' in s.type]
    epochs = cfg.train_cfg.max_epochs
    plan = make_plan(48, 2, max_per_gpu_batch=6, base_batch_size=48 * 2)
    apply_plan(cfg, plan)
    assert (cfg.train_dataloader.batch_size, cfg.optim_wrapper.accumulative_counts) == (6, 4)
    assert cfg.optim_wrapper.optimizer.lr == pytest.approx(lr * 0.5)
    assert [s.eta_min for s in cfg.param_scheduler if s.type == 'CosineAnnealingLR'] == \
        pytest.approx([v * 0.5 for v in lr_eta])  # absolute LR values follow the LR
    assert [s.eta_min for s in cfg.param_scheduler if 'Momentum' in s.type] == mom_eta
    assert cfg.train_cfg.max_epochs == epochs  # epochs do not depend on the split
    # a second plan starts from the user's values, not from the first plan's
    apply_plan(cfg, make_plan(48, 8, max_per_gpu_batch=6))
    assert cfg.optim_wrapper.optimizer.lr == pytest.approx(lr)
    assert cfg.train_dataloader.batch_size == 6
    assert 'accumulative_counts' not in cfg.optim_wrapper
    assert recorded_plan(cfg).world_size == 8


def test_iteration_counts_mean_optimizer_steps(tmp_path):
    cfg = toy_cfg(str(tmp_path), max_iters=6, checkpoint_interval=3)
    apply_plan(cfg, make_plan(8, 1, max_per_gpu_batch=2))
    assert cfg.optim_wrapper.accumulative_counts == 4
    assert cfg.train_cfg.max_iters == 24
    assert cfg.default_hooks.checkpoint.interval == 12
    # stock mmengine steps schedulers per loop iteration (micro-batch)
    assert cfg.param_scheduler[0].milestones == [12]


def test_checkpoint_save_begin_counts_optimizer_steps_too(tmp_path):
    # interval scaled but save_begin not: checkpoints at odd micro-steps, i.e. inside
    # accumulation windows
    cfg = toy_cfg(str(tmp_path), max_iters=6, checkpoint_interval=2)
    cfg.default_hooks.checkpoint.save_begin = 3
    apply_plan(cfg, make_plan(4, 1, max_per_gpu_batch=2))
    assert (cfg.default_hooks.checkpoint.interval,
            cfg.default_hooks.checkpoint.save_begin) == (4, 6)
    apply_plan(cfg, make_plan(2, 1, max_per_gpu_batch=2))  # back to no accumulation
    assert (cfg.default_hooks.checkpoint.interval,
            cfg.default_hooks.checkpoint.save_begin) == (2, 3)


def test_recipe_adds_the_window_checkpoint_hook_once(tmp_path):
    cfg = toy_cfg(str(tmp_path), scaling=dict(total_batch_size=8))
    prepared = prepare_config(copy.deepcopy(cfg))
    types = [h.type for h in prepared.custom_hooks]
    assert types.count('AccumulationCheckpointHook') == 1
    assert prepare_config(copy.deepcopy(prepared)).custom_hooks == prepared.custom_hooks


def test_prepare_config_applies_the_recipe_once(tmp_path):
    cfg = toy_cfg(str(tmp_path), scaling=dict(total_batch_size=8, base_batch_size=4))
    prepared = prepare_config(copy.deepcopy(cfg))
    assert prepared.optim_wrapper.optimizer.lr == pytest.approx(0.1)
    assert prepared.optim_wrapper.accumulative_counts == 4
    assert any(h.type == 'ScalingPlanHook' for h in prepared.custom_hooks)
    again = prepare_config(copy.deepcopy(prepared))
    assert again.to_dict() == prepared.to_dict()


@pytest.mark.parametrize('extra,match', [
    (dict(auto_scale_lr=dict(enable=True, base_batch_size=4)), 'auto_scale_lr.enable=True and scaling'),
    (dict(optim_wrapper=dict(type='OptimWrapper', accumulative_counts=2,
                             optimizer=dict(type='SGD', lr=0.1))),
     r'accumulative_counts = 2; scaling \(derived accumulation\) = 4'),
    (dict(scaling=dict(total_batch_size=8, per_gpu=2)), r'unknown key\(s\) in scaling: per_gpu'),
])
def test_conflicting_settings_are_errors(tmp_path, extra, match):
    cfg = toy_cfg(str(tmp_path), scaling=dict(total_batch_size=8))
    cfg.merge_from_dict(extra)
    if 'scaling' in extra:
        cfg.scaling = extra['scaling']
    with pytest.raises(ValueError, match=match):
        prepare_config(cfg)


def test_auto_scale_lr_alone_counts_the_accumulation(tmp_path):
    cfg = toy_cfg(str(tmp_path), auto_scale_lr=dict(enable=True, base_batch_size=8))
    cfg.optim_wrapper.accumulative_counts = 2  # effective batch 1 x 2 x 2 = 4
    prepared = prepare_config(cfg)
    assert prepared.optim_wrapper.optimizer.lr == pytest.approx(0.05 * 4 / 8)
    assert prepared.auto_scale_lr.enable is False  # mmengine must not scale again


@pytest.mark.slow
def test_runner_trains_with_the_plan_and_prints_it(tmp_path):
    cfg = toy_cfg(str(tmp_path), max_iters=2, name='plan', log_level='INFO',
                  scaling=dict(total_batch_size=8, lr_scaling='none'))
    runner = Runner.from_cfg(cfg)
    runner.train()
    assert runner.train_dataloader.batch_size == 2
    assert runner.optim_wrapper._accumulative_counts == 4
    assert runner.iter == 8  # 2 optimizer steps of 4 micro-batches
    with open(osp.join(runner.log_dir, f'{runner.timestamp}.log')) as f:
        log = f.read()
    assert 'Scaling plan' in log and '8 = 1 x 2 x 4' in log
