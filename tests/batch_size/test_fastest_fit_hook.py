"""FastestFitHook in a real mmengine Runner training the demo PointPillars on synthetic
KITTI-format data, with a modelled device standing in for the GPU: 1 MiB a sample,
a 3 MiB budget and the default 10 % margin (2.7 MiB allowed), so batches 1 and 2 fit
and 4 does not. PointPillars has no gradient checkpointing to switch, so the
variants are batch sizes (checkpointing is switched on a real BEVFusion in
tests/batch_size/test_fastest_fit.py)."""
import json
import os.path as osp
import re

import pytest
from mmengine.config import Config

from mmdet3d_scaling.batch_size.fastest_fit import Variant
from mmdet3d_scaling.batch_size.fastest_fit_hook import FastestFitHook
from mmdet3d_scaling.config.preparation import prepare_config
from tests.auto_batch_size_common import demo_config
from tests.batch_size.runs import MiB, modeled_probe
from tests.batch_size.runs import train as train_with


def probe(per_sample: float = MiB) -> dict:
    return modeled_probe(1024 * MiB, per_sample)


def config(data_root: str, work_dir: str, max_iters: int = 1, budget='3MiB',
           **hook_args) -> Config:
    cfg = demo_config(data_root, work_dir, batch_size=4, max_iters=max_iters)
    cfg.runner_type = 'ScalingRunner'
    cfg.scaling = dict(total_batch_size=4, memory_budget=budget)
    cfg.log_level = 'INFO'  # the choice is logged at INFO
    cfg.custom_hooks = [dict(type='FastestFitHook', warmup_steps=1, timed_steps=1,
                             **hook_args)]
    return cfg


def train(cfg: Config):
    return train_with(cfg, FastestFitHook)


@pytest.mark.slow
def test_fastest_that_fits_keeps_the_total_logs_and_caches(data_root, tmp_path):
    work_dir = str(tmp_path / 'work')
    runner, hook, seen, log = train(config(data_root, work_dir, probe=probe(),
                                           min_gain=0.0))
    result = hook.result
    # preference order: largest batch first (no checkpointing to switch here)
    assert [t.variant for t in result.trials] == [
        Variant(4, False), Variant(2, False), Variant(1, False)]
    assert result.trials[0].oom and not result.trials[0].fits
    fitting = [t for t in result.trials if t.fits]
    assert [t.batch_size for t in fitting] == [2, 1]
    fastest = max(fitting, key=lambda t: t.samples_per_s)
    assert result.batch_size == fastest.batch_size and not result.checkpointing
    assert result.limit_bytes == int(3 * MiB * 0.9) and not result.from_cache
    # the effective batch is kept: batch x accumulation = 4, one optimizer step
    batch = result.batch_size
    assert (hook.plan.per_gpu_batch, hook.plan.accumulation, hook.plan.total_batch) == \
        (batch, 4 // batch, 4)
    assert seen.batches == [batch] * (4 // batch)
    assert seen.stepped == [False] * (4 // batch - 1) + [True]
    assert runner.cfg.train_dataloader.batch_size == batch
    # the choice, its speed and memory are in the log, with every trial
    choice = next(line for line in log if line.startswith('fastest fit: per-GPU batch'))
    assert f'per-GPU batch {batch}, checkpointing off' in choice
    assert f'{result.samples_per_s:.2f} samples/s' in choice
    assert 'reserved' in choice and 'allocated' in choice
    assert '1 GPU(s) x' in choice and '= 4.' in choice
    assert re.search(r'batch 4, checkpointing off +OOM', choice)
    assert re.search(rf'batch {batch}, checkpointing off +yes .*<- chosen', choice)
    cached = json.load(open(osp.join(work_dir, 'auto_batch_size.json')))
    assert [e['batch_size'] for e in cached.values()] == [batch]

    # resume: same setting -> the cached choice, no trials. The probe now says 3 MiB a
    # sample (not in the cache key): a search would find nothing that fits.
    cfg = config(data_root, work_dir, max_iters=2, probe=probe(per_sample=3 * MiB),
                 min_gain=0.0)
    cfg.resume = True
    runner, hook, seen, log = train(cfg)
    assert hook.result.from_cache and hook.result.batch_size == batch
    assert any('from the cache' in line for line in log)
    assert seen.batches == [batch] * (4 // batch)  # the second optimizer step

    # another budget is another setting: searched again, and 4 MiB a sample fits nowhere
    cfg = config(data_root, work_dir, budget='4MiB', probe=probe(per_sample=4 * MiB))
    with pytest.raises(RuntimeError, match='no variant trains in'):
        train(cfg)


@pytest.mark.slow
def test_fixed_per_gpu_batch_leaves_only_that_batch(data_root, tmp_path):
    cfg = config(data_root, str(tmp_path), probe=probe())
    cfg.scaling.per_gpu_batch_size = 1
    runner, hook, seen, _ = train(cfg)
    assert [t.batch_size for t in hook.result.trials] == [1]
    assert seen.batches == [1, 1, 1, 1]


@pytest.mark.slow
def test_bad_settings_are_errors_that_name_the_value(data_root, tmp_path):
    with pytest.raises(ValueError, match='budget_bytes must be a positive number'):
        FastestFitHook(budget_bytes='lots')
    with pytest.raises(ValueError, match=r'batch_sizes .*\[3\]'):
        train(config(data_root, str(tmp_path), probe=probe(), batch_sizes=[4, 3]))


def test_prepared_one_gpu_bevfusion_config_asks_for_it():
    """configs/bevfusion_1gpu.py: a 24 GiB budget, total 32, batches 4, 2, 1 to try."""
    cfg = Config.fromfile(osp.join(osp.dirname(osp.dirname(osp.dirname(
        osp.abspath(__file__)))), 'configs', 'bevfusion_1gpu.py'))
    assert cfg.scaling.memory_budget == '24GiB' and cfg.scaling.total_batch_size == 32
    cfg.preflight = dict(check_data=False)
    cfg.launcher = 'none'
    cfg = prepare_config(cfg)
    [hook] = [h for h in cfg.custom_hooks if h['type'] == 'FastestFitHook']
    assert hook.budget_bytes == 24 * 2**30 and hook.recipe.total_batch_size == 32
    plan = cfg.scaling_plan['plan']
    assert [plan[k] for k in ('per_gpu_batch', 'accumulation', 'total_batch')] == \
        [4, 8, 32]
    assert cfg.model.img_backbone.with_cp and cfg.model.view_transform.with_cp
    assert cfg.model.view_transform.memory_efficient
