"""mmcv 1.x optimizer_config / fp16 keys and the plugin's amp key.

Unit tests of the config steps, then the stock tool path: ``Runner.from_cfg`` after
``import mmdet3d_scaling`` (what mmdet3d's tools/train.py does), and our
``tools/train.py --amp`` on this CPU-only machine.
"""
from pathlib import Path

import torch
import pytest
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.optim import AmpOptimWrapper
from mmengine.runner import Runner

import mmdet3d_scaling  # noqa: F401
from mmdet3d_scaling.patches.cpu import amp_cpu
from mmdet3d_scaling.config.preparation import prepare_config
from mmdet3d_scaling.config import prepare_config
from mmdet3d_scaling.config.legacy_keys import (AUTO_FP16_LOSS_SCALE,
                                                  ConfigConflictError,
                                                  cuda_bf16_supported,
                                                  resolve_auto_amp,
                                                  translate_amp_config,
                                                  translate_optimizer_config)
from mmdet3d_scaling.hooks.gradient_cumulative_optimizer_hook import \
    GradientCumulativeOptimizerHook
from tests.toy import toy_runner_cfg

SGD = dict(type='SGD', lr=0.1, momentum=0.9)


def cfg_of(**keys) -> Config:
    base = dict(optim_wrapper=dict(type='OptimWrapper', optimizer=SGD))
    base.update(keys)
    return Config(base)


def acc_hooks(cfg: Config) -> list:
    return [h for h in cfg.get('custom_hooks', [])
            if h['type'].endswith('GradientCumulativeOptimizerHook')]


# ------------------------------------------------------------- optimizer_config
def test_gradient_cumulative_optimizer_config_becomes_hook_and_wrapper():
    cfg = translate_optimizer_config(cfg_of(optimizer_config=dict(
        type='GradientCumulativeOptimizerHook', cumulative_iters=4,
        grad_clip=dict(max_norm=35, norm_type=2))))
    assert 'optimizer_config' not in cfg
    assert cfg.optim_wrapper.accumulative_counts == 4
    assert cfg.optim_wrapper.clip_grad == dict(max_norm=35, norm_type=2)
    assert acc_hooks(cfg) == [dict(type='mmdet3d.GradientCumulativeOptimizerHook',
                                   cumulative_iters=4)]
    assert (cfg.default_hooks.param_scheduler.type
            == 'mmdet3d.OptimizerStepParamSchedulerHook')


def test_translation_is_idempotent():
    cfg = translate_optimizer_config(cfg_of(optimizer_config=dict(
        type='GradientCumulativeOptimizerHook', cumulative_iters=4)))
    again = translate_optimizer_config(Config(cfg.to_dict()))
    assert again.to_dict() == cfg.to_dict()


def test_plain_optimizer_hook_maps_grad_clip_only():
    cfg = translate_optimizer_config(cfg_of(
        optimizer_config=dict(grad_clip=dict(max_norm=10))))
    assert cfg.optim_wrapper.clip_grad == dict(max_norm=10)
    assert 'accumulative_counts' not in cfg.optim_wrapper
    assert 'optimizer_config' not in cfg and not acc_hooks(cfg)


def test_hook_in_custom_hooks_sets_the_wrapper():
    cfg = translate_optimizer_config(cfg_of(custom_hooks=[dict(
        type='GradientCumulativeOptimizerHook', cumulative_iters=3,
        grad_clip=dict(max_norm=1))]))
    assert cfg.optim_wrapper.accumulative_counts == 3
    assert cfg.optim_wrapper.clip_grad == dict(max_norm=1)
    assert len(acc_hooks(cfg)) == 1


def test_unknown_optimizer_config_type_is_an_error():
    with pytest.raises(ValueError, match="'DistOptimizerHook'"):
        translate_optimizer_config(
            cfg_of(optimizer_config=dict(type='DistOptimizerHook')))


@pytest.mark.parametrize('other, place', [
    (dict(optim_wrapper=dict(optimizer=SGD, accumulative_counts=2)),
     'optim_wrapper.accumulative_counts = 2'),
    (dict(custom_hooks=[dict(type='GradientCumulativeOptimizerHook',
                             cumulative_iters=8)]),
     'GradientCumulativeOptimizerHook.cumulative_iters = 8'),
    (dict(scaling_plan=dict(plan=dict(accumulation=2))),
     'scaling (derived accumulation) = 2'),
    # the recipe, not yet applied: 16 samples per step / (1 GPU x batch 2) = 8
    (dict(scaling=dict(total_batch_size=16), train_dataloader=dict(batch_size=2)),
     'scaling (derived accumulation) = 8'),
])
def test_conflicting_accumulation_names_both_values(other, place):
    cfg = cfg_of(optimizer_config=dict(type='GradientCumulativeOptimizerHook',
                                       cumulative_iters=4))
    cfg.merge_from_dict(other)
    with pytest.raises(ConfigConflictError) as err:
        prepare_config(cfg)  # works out the recipe's accumulation once, for the check
    assert 'optimizer_config.cumulative_iters = 4' in str(err.value)
    assert place in str(err.value)


def test_conflicting_grad_clip_is_an_error():
    cfg = cfg_of(optimizer_config=dict(grad_clip=dict(max_norm=35)))
    cfg.optim_wrapper.clip_grad = dict(max_norm=10)
    with pytest.raises(ConfigConflictError, match='max_norm'):
        translate_optimizer_config(cfg)


# ------------------------------------------------------------------------- AMP
@pytest.mark.parametrize('keys, loss_scale, dtype', [
    (dict(fp16=dict(loss_scale=512)), 512.0, 'float16'),
    (dict(fp16=dict(loss_scale='dynamic')), 'dynamic', 'float16'),
    (dict(amp=dict(dtype='bfloat16')), dict(enabled=False), 'bfloat16'),
    (dict(amp=dict(dtype='bfloat16', loss_scale='dynamic')), 'dynamic', 'bfloat16'),
    (dict(amp=dict(dtype='float16')), 'dynamic', 'float16'),
    (dict(optimizer_config=dict(type='Fp16OptimizerHook', loss_scale=256.)),
     256.0, 'float16'),
])
def test_amp_keys_map_to_amp_optim_wrapper(keys, loss_scale, dtype):
    cfg = translate_amp_config(translate_optimizer_config(cfg_of(**keys)))
    assert cfg.optim_wrapper.type == 'AmpOptimWrapper'
    assert cfg.optim_wrapper.loss_scale == loss_scale
    assert cfg.optim_wrapper.dtype == dtype
    assert not {'fp16', 'amp', 'optimizer_config'} & set(cfg)


def test_amp_conflicts_are_errors():
    with pytest.raises(ConfigConflictError, match='fp16.*amp'):
        translate_amp_config(cfg_of(fp16=dict(loss_scale=512.),
                                    amp=dict(dtype='bfloat16')))
    cfg = cfg_of(fp16=dict(loss_scale=512.))
    cfg.optim_wrapper.update(type='AmpOptimWrapper', loss_scale=128.)
    with pytest.raises(ConfigConflictError, match='128.0.*512.0'):
        translate_amp_config(cfg)
    with pytest.raises(ValueError, match="'float8'"):
        translate_amp_config(cfg_of(amp=dict(dtype='float8')))


# ------------------------------------------------------------- amp dtype='auto'
def test_auto_resolution_for_either_device():
    assert resolve_auto_amp(True) == dict(dtype='bfloat16',
                                          loss_scale=dict(enabled=False))
    assert resolve_auto_amp(True, loss_scale=512) == resolve_auto_amp(True)
    fp16 = resolve_auto_amp(False)
    assert fp16 == dict(dtype='float16', loss_scale=AUTO_FP16_LOSS_SCALE)
    # the first steps must not overflow fp16 with losses of ~2**13 (BEVFusion)
    assert fp16['loss_scale']['init_scale'] * 2 ** 13 <= 2 ** 16
    assert resolve_auto_amp(False, loss_scale=64) == dict(dtype='float16',
                                                          loss_scale=64.0)
    with pytest.raises(ValueError, match="amp.loss_scale.*'huge'"):
        resolve_auto_amp(False, loss_scale='huge')


def test_auto_on_this_machine_is_resolved_and_logged(capsys):
    from mmengine.logging import MMLogger
    # the current logger: an INFO one created here (an earlier test's runner may have
    # left a WARNING logger current)
    MMLogger.get_instance('auto_amp_test', log_level='INFO')
    native, reason = cuda_bf16_supported()
    if not torch.cuda.is_available():
        assert (native, reason) == (False, 'no CUDA device')
    else:  # pre-Ampere GPUs emulate bf16: is_bf16_supported() alone would say True
        major = torch.cuda.get_device_capability()[0]
        assert native == (major >= 8 or bool(torch.version.hip))
    cfg = translate_amp_config(cfg_of(amp=dict(dtype='auto')))
    assert cfg.optim_wrapper.type == 'AmpOptimWrapper'
    assert {k: cfg.optim_wrapper[k] for k in ('dtype', 'loss_scale')} == \
        resolve_auto_amp(native)
    assert 'amp' not in cfg
    assert "amp dtype='auto': " + reason in capsys.readouterr().out


def test_auto_conflicts_and_bad_dtype_name_the_values():
    cfg = cfg_of(amp=dict(dtype='auto'))
    cfg.optim_wrapper.update(type='AmpOptimWrapper', loss_scale='dynamic')
    with pytest.raises(ConfigConflictError, match='dynamic'):
        translate_amp_config(cfg)
    with pytest.raises(ValueError, match="'auto'.*'fp16'"):
        translate_amp_config(cfg_of(amp=dict(dtype='fp16')))


def test_bevfusion_1gpu_recipe_uses_auto(tmp_path):
    cfg = Config.fromfile(str(Path(__file__).resolve().parents[2] / 'configs'
                                 / 'bevfusion_1gpu.py'))
    assert cfg.amp == dict(dtype='auto')
    cfg.preflight = dict(check_data=False)
    cfg = prepare_config(cfg)
    native, _ = cuda_bf16_supported()
    assert cfg.optim_wrapper.type == 'AmpOptimWrapper'
    assert cfg.optim_wrapper.dtype == resolve_auto_amp(native)['dtype']
    assert cfg.scaling_plan['plan']['total_batch'] == 32


@pytest.mark.slow
def test_auto_trains_through_runner_on_this_machine(tmp_path):
    runner = Runner.from_cfg(toy_config(tmp_path, amp=dict(dtype='auto')))
    runner.train()
    assert isinstance(runner.optim_wrapper, AmpOptimWrapper)
    if not amp_cpu.accelerator_available():  # patches/cpu/amp_cpu.py: bf16, scaling off
        assert runner.optim_wrapper.cast_dtype == torch.bfloat16
        assert not runner.optim_wrapper.loss_scaler.is_enabled()
    assert counter(runner).changed == list(range(1, 8))  # every step updates


# -------------------------------------------------------- through Runner.from_cfg
class StepCounter(Hook):
    """Counts iterations after which the parameters changed."""

    # valid Python: Runner logs the config with yapf
    def __repr__(self):
        return 'StepCounter()'

    def __init__(self):
        self.before = None
        self.changed = []

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        now = torch.cat([p.detach().flatten().clone() for p in runner.model.parameters()])
        if self.before is not None and not torch.equal(now, self.before):
            self.changed.append(runner.iter)
        self.before = now


def toy_config(work_dir, **keys) -> Config:
    cfg = toy_runner_cfg(work_dir, max_iters=8, batch_size=2, default_scope='mmdet3d',
                         custom_hooks=[StepCounter()])
    cfg['train_dataloader']['dataset'] = dict(type='ToyDataset', length=16)
    cfg['optim_wrapper'] = dict(optimizer=SGD)
    cfg.update(keys)
    return Config(cfg)


def counter(runner: Runner) -> StepCounter:
    return next(h for h in runner.hooks if isinstance(h, StepCounter))


@pytest.mark.slow
def test_legacy_optimizer_config_through_runner_from_cfg(tmp_path):
    runner = Runner.from_cfg(toy_config(tmp_path, optimizer_config=dict(
        type='GradientCumulativeOptimizerHook', cumulative_iters=4)))
    assert any(isinstance(h, GradientCumulativeOptimizerHook) for h in runner.hooks)
    runner.train()
    assert runner.optim_wrapper._accumulative_counts == 4
    assert counter(runner).changed == [3, 7]  # 8 micro-steps, 2 optimizer steps


@pytest.mark.slow
def test_fp16_with_accumulation_on_cpu(tmp_path):
    runner = Runner.from_cfg(toy_config(tmp_path, fp16=dict(loss_scale=512.),
                                        optimizer_config=dict(
                                            type='GradientCumulativeOptimizerHook',
                                            cumulative_iters=2)))
    runner.train()
    wrapper = runner.optim_wrapper
    assert isinstance(wrapper, AmpOptimWrapper)
    if not amp_cpu.accelerator_available():  # this machine: bf16 autocast instead
        assert wrapper.cast_dtype == torch.bfloat16
    assert counter(runner).changed == [1, 3, 5, 7]
    assert all(torch.isfinite(p).all() for p in runner.model.parameters())


def test_prepare_config_twice_changes_nothing(tmp_path):
    cfg = prepare_config(toy_config(tmp_path, fp16=dict(loss_scale='dynamic'),
                                    optimizer_config=dict(
                                        type='GradientCumulativeOptimizerHook',
                                        cumulative_iters=2)))
    before = cfg.to_dict()
    assert prepare_config(cfg).to_dict() == before


CLI_CONFIG = '''
default_scope = 'mmdet3d'
custom_imports = dict(imports=['tests.toy', 'mmdet3d_scaling'])
model = dict(type='ToyRegressor')
train_dataloader = dict(
    dataset=dict(type='ToyDataset', length=8), batch_size=2,
    num_workers=0, sampler=dict(type='DefaultSampler', shuffle=False),
    collate_fn=dict(type='default_collate'))
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.01))
train_cfg = dict(by_epoch=False, max_iters=3)
default_hooks = dict(checkpoint=dict(type='CheckpointHook', interval=3, by_epoch=False))
log_level = 'WARNING'
'''


def test_tools_train_amp_on_cpu(tmp_path):
    config = tmp_path / 'toy_amp.py'
    config.write_text(CLI_CONFIG)
    from mmdet3d_scaling.engine.cli import train_main
    runner = train_main([str(config), '--amp', '--work-dir', str(tmp_path / 'work')])
    assert isinstance(runner.optim_wrapper, AmpOptimWrapper)
    assert runner.iter == 3
    assert (tmp_path / 'work' / 'iter_3.pth').is_file()
