"""Exact resumes with real Runners, checkpoint files and processes.

- a plan change between save and resume (total batch, world size with a checkpoint
  inside an accumulation window) gives the LR, ``initial_lr`` and scheduler states of a
  run that trained from scratch with the new plan to the same number of samples;
- under the ``scaling`` recipe checkpoints land on window ends, and one that still
  lands inside a window (here: after a ``kill -9``) resumes bit-exactly;
- ``--resume`` / ``tools/test.py`` refuse a checkpoint that does not fit the model
  unless ``resume_strict=False``; ``load_from`` (fine-tuning) logs a summary.
"""
import glob
import os
import os.path as osp
import signal
import subprocess
import sys
from typing import List

import pytest
import torch
from mmengine.config import Config
from mmengine.evaluator import BaseMetric
from mmengine.hooks import Hook
from mmengine.registry import HOOKS, METRICS, MODELS
from mmengine.runner import Runner

import mmdet3d_scaling  # noqa: F401
from mmdet3d_scaling.engine import cli
from mmdet3d_scaling.hooks.gradient_cumulative_optimizer_hook import CHECKPOINT_KEY
from tests.parallel.dist_parts import spawn_checks, toy_cfg
from tests.toy import ToyRegressor

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
# LR that depends on the position: a chained warm-up, then a chained cosine decay
# (counts are optimizer steps; the recipe converts them to loop iterations)
SCHEDULE = [dict(type='LinearLR', start_factor=0.25, by_epoch=False, begin=0, end=4),
            dict(type='CosineAnnealingLR', by_epoch=False, begin=4, end=12,
                 eta_min=0.001)]


# ------------------------------------------------------------------ registered parts
@HOOKS.register_module(name='RZSnapshotHook', force=True)
class RZSnapshotHook(Hook):
    """Saves (rank 0) the optimizer's scheduled values and the scheduler states at the
    start of training (after a resume) and before every iteration."""

    priority = 'LOWEST'

    def __init__(self, path: str):
        self.path = path
        self.record: dict = {}

    @staticmethod
    def snapshot(runner) -> dict:
        groups = [dict(lr=g['lr'], initial_lr=g.get('initial_lr'))
                  for g in runner.optim_wrapper.optimizer.param_groups]
        return dict(groups=groups,
                    schedulers=[s.state_dict() for s in runner.param_schedulers])

    def before_train(self, runner) -> None:
        self.record = dict(start_iter=runner.iter, start=self.snapshot(runner), iters={})

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        self.record['iters'][runner.iter] = self.snapshot(runner)

    def after_train(self, runner) -> None:
        if runner.rank == 0:
            torch.save(self.record, self.path)


@HOOKS.register_module(name='RZKillAt', force=True)
class RZKillAt(Hook):
    """``kill -9`` of its own process after iteration ``at`` (after its checkpoint)."""

    priority = 'LOWEST'  # after CheckpointHook (VERY_LOW) wrote the file

    def __init__(self, at: int):
        self.at = at

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if runner.iter + 1 == self.at:
            os.kill(os.getpid(), signal.SIGKILL)


@MODELS.register_module(name='RZToyWide', force=True)
class RZToyWide(ToyRegressor):
    """ToyRegressor whose linear layer has 2 outputs (a shape mismatch)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)


@MODELS.register_module(name='RZToyWithBuffer', force=True)
class RZToyWithBuffer(ToyRegressor):
    """ToyRegressor with one more buffer (same parameters, so the optimizer fits)."""

    def __init__(self):
        super().__init__()
        self.register_buffer('calibration', torch.zeros(3))


@METRICS.register_module(name='RZToyMetric', force=True)
class RZToyMetric(BaseMetric):
    """Mean prediction (enough to see that evaluation ran)."""

    def process(self, data_batch, data_samples):
        self.results.append(float(torch.as_tensor(data_samples).mean()))

    def compute_metrics(self, results):
        return dict(mean_pred=sum(results) / len(results))


# ------------------------------------------------------------------------ helpers
def recipe_cfg(work_dir: str, name: str, total: int, snapshot: str = None,
               hooks: List[dict] = (), steps: int = 12, **extra) -> Config:
    """``steps`` optimizer steps of the warm-up + cosine schedule, ``total`` per step."""
    custom = [dict(type='RZSnapshotHook', path=snapshot)] if snapshot else []
    return toy_cfg(work_dir, name=name, max_iters=steps, batch_size=2,
                   scaling=dict(total_batch_size=total, base_batch_size=4),
                   param_scheduler=SCHEDULE, custom_hooks=custom + list(hooks), **extra)


def train(cfg: Config) -> Runner:
    runner = Runner.from_cfg(cfg)
    runner.train()
    return runner


def resume_cfg(cfg: Config, ckpt: str) -> Config:
    cfg.merge_from_dict(dict(load_from=ckpt, resume=True, trusted_checkpoints=[ckpt]))
    return cfg


def assert_same_state(resumed: dict, reference: dict) -> None:
    assert resumed['groups'] == reference['groups']
    assert resumed['schedulers'] == reference['schedulers']


def assert_same_lr_from(resumed: dict, reference: dict) -> None:
    """The LR before every iteration of the resumed run equals the reference's."""
    iters = sorted(resumed['iters'])
    assert iters and iters[0] == resumed['start_iter']
    assert [resumed['iters'][i]['groups'] for i in iters] == [
        reference['iters'][i]['groups'] for i in iters]


# ------------------------------------------------------- plan change: total batch
@pytest.mark.slow
def test_total_batch_change_resumes_with_the_new_lr_and_schedule(tmp_path):
    out = str(tmp_path)
    # A: 4 = 1 GPU x 2 x 2 accumulation, LR x 1; checkpoint after 4 steps (16 samples)
    train(recipe_cfg(osp.join(out, 'a'), 'a', 4, checkpoint_interval=4))
    ckpt = osp.join(out, 'a', 'iter_8.pth')
    saved = torch.load(ckpt, map_location='cpu', weights_only=False)
    # B: 8 = 1 GPU x 2 x 4, LR x 2, from scratch; 16 samples = 2 steps = iteration 8
    train(recipe_cfg(osp.join(out, 'b'), 'b', 8, snapshot=osp.join(out, 'b.pth')))
    resumed = train(resume_cfg(recipe_cfg(osp.join(out, 'r'), 'r', 8,
                                          snapshot=osp.join(out, 'r.pth')), ckpt))
    ref, got = torch.load(osp.join(out, 'b.pth')), torch.load(osp.join(out, 'r.pth'))
    assert got['start_iter'] == 8
    assert got['start']['groups'][0]['initial_lr'] == pytest.approx(0.1)  # 0.05 x 8/4
    assert_same_state(got['start'], ref['iters'][8])
    assert_same_lr_from(got, ref)
    # the checkpoint itself had the old scale and position: the conversion did this
    old_group = saved['optimizer']['param_groups'][0]
    assert (old_group['lr'], old_group['initial_lr']) != (
        got['start']['groups'][0]['lr'], got['start']['groups'][0]['initial_lr'])
    hook = next(h for h in resumed.hooks if type(h).__name__ == 'ScalingPlanHook')
    assert (hook.conversion['old_iter'], hook.conversion['new_iter']) == (8, 8)


# ------------------------------------- plan change: world size, mid-window checkpoint
def check_reference_two_gpus(rank, world, out):
    train(recipe_cfg(osp.join(out, 'b2'), 'b2', 4, launcher='pytorch',
                     snapshot=osp.join(out, 'b2.pth')))
    return {}


def check_resume_mid_window_on_two_gpus(rank, world, out):
    ckpt = osp.join(out, 'a1', 'iter_9.pth')
    runner = train(resume_cfg(recipe_cfg(osp.join(out, 'r2'), 'r2', 4, launcher='pytorch',
                                         snapshot=osp.join(out, 'r2.pth')), ckpt))
    hook = next(h for h in runner.hooks if type(h).__name__ == 'ScalingPlanHook')
    return dict(conversion=hook.conversion)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_world_size_change_from_a_mid_window_checkpoint(tmp_path):
    out = str(tmp_path)
    # A: 1 GPU x 2 x 2 accumulation; a CheckpointHook the recipe does not convert
    # saves at iteration 9, one micro-batch into the window of optimizer step 5
    mid_window = dict(type='CheckpointHook', by_epoch=False, interval=9, save_last=False)
    train(recipe_cfg(osp.join(out, 'a1'), 'a1', 4, hooks=[mid_window]))
    saved = torch.load(osp.join(out, 'a1', 'iter_9.pth'), weights_only=False)
    assert saved[CHECKPOINT_KEY]['micro_steps'] == 1
    results = spawn_checks(2, out, [check_reference_two_gpus,
                                    check_resume_mid_window_on_two_gpus])
    ref, got = torch.load(osp.join(out, 'b2.pth')), torch.load(osp.join(out, 'r2.pth'))
    conv = results[0]['check_resume_mid_window_on_two_gpus']['conversion']
    # 4 whole steps of 4 samples = 16 samples = iteration 4 on 2 GPUs x 2 x 1
    assert (conv['old_iter'], conv['new_iter'], conv['samples_seen']) == (9, 4, 16)
    assert_same_state(got['start'], ref['iters'][4])
    assert_same_lr_from(got, ref)  # not hot for the rest of the schedule
    # (parameters are compared with a step-wise schedule in test_ddp_runner.py: with
    # a continuous one the recipe's per-micro-batch scheduler steps give the window's
    # optimizer step another LR than a plan without accumulation)


# -------------------------------------------- checkpoints and windows under the recipe
@pytest.mark.slow
def test_recipe_checkpoints_land_on_window_ends(tmp_path):
    # interval 2 and save_begin 1 optimizer steps, 2 micro-batches per step
    cfg = recipe_cfg(str(tmp_path), 'ends', 4, steps=6)
    cfg.default_hooks.checkpoint.update(interval=2, save_begin=1)
    train(cfg)
    saved = sorted(int(osp.basename(p)[5:-4])
                   for p in glob.glob(str(tmp_path / 'iter_*.pth')))
    assert saved == [2, 6, 10, 12]  # steps 1, 3, 5 and the last one
    for it in saved:
        ckpt = torch.load(str(tmp_path / f'iter_{it}.pth'), weights_only=False)
        assert CHECKPOINT_KEY not in ckpt


KILLED_RUN = """
import sys
sys.path.insert(0, {root!r})
import tests.reliability.test_resume  # registers the toy parts
from mmengine.config import Config
from mmengine.runner import Runner
Runner.from_cfg(Config.fromfile({config!r})).train()
"""


@pytest.mark.slow
def test_kill_9_inside_a_window_then_resume_is_bit_exact(tmp_path):
    # a checkpoint every 5 iterations (not a multiple of the accumulation 2): the
    # recipe's AccumulationCheckpointHook puts the unfinished window into it
    every_5 = dict(type='CheckpointHook', by_epoch=False, interval=5, save_last=False)
    whole = train(recipe_cfg(str(tmp_path / 'whole'), 'whole', 4, hooks=[every_5]))
    work = str(tmp_path / 'killed')
    config = str(tmp_path / 'killed.py')
    recipe_cfg(work, 'killed', 4, hooks=[every_5, dict(type='RZKillAt', at=5)]).dump(config)
    proc = subprocess.run([sys.executable, '-c', KILLED_RUN.format(root=ROOT,
                                                                  config=config)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    ckpt = torch.load(osp.join(work, 'iter_5.pth'), weights_only=False)
    assert ckpt[CHECKPOINT_KEY]['micro_steps'] == 1
    assert not glob.glob(osp.join(work, 'iter_1[0-9].pth'))  # it really died at 5
    # `tools/train.py --resume` (no value): the latest checkpoint of the work dir
    resumed = recipe_cfg(work, 'killed', 4, hooks=[every_5], resume=True,
                         trusted_checkpoints=[osp.join(work, 'iter_5.pth')])
    runner = train(resumed)
    assert runner.iter == whole.iter == 24
    for name, value in runner.model.state_dict().items():
        assert torch.equal(value, whole.model.state_dict()[name]), name


# --------------------------------------------------------- checkpoint <-> model match
@pytest.fixture(scope='module')
def toy_checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp('match')
    train(toy_cfg(str(out / 'a'), name='match_a', max_iters=2))
    return str(out / 'a' / 'iter_2.pth')


def _resume(tmp_path, ckpt: str, model: str, **extra) -> Runner:
    cfg = toy_cfg(str(tmp_path), name='match_r', max_iters=4, model=model, **extra)
    return train(resume_cfg(cfg, ckpt))


@pytest.mark.slow
@pytest.mark.parametrize('model,expected', [
    ('H4ToyWithBN', ['4 missing, 0 unexpected, 0 shape-mismatched', 'missing: bn.weight, '
                     'bn.bias, bn.running_mean, bn.running_var']),
    ('RZToyWide', ['0 missing, 0 unexpected, 2 shape-mismatched',
                   'linear.weight (checkpoint [1, 4] vs model [2, 4])']),
])
def test_resume_refuses_a_checkpoint_of_another_model(tmp_path, toy_checkpoint, model,
                                                      expected):
    with pytest.raises(RuntimeError) as err:
        _resume(tmp_path, toy_checkpoint, model)
    message = str(err.value)
    for part in expected + [toy_checkpoint, model, 'resume_strict=False',
                            'load_from without --resume']:
        assert part in message
    assert not glob.glob(str(tmp_path / 'iter_*.pth'))  # nothing trained


@pytest.mark.slow
def test_resume_strict_false_loads_anyway(tmp_path, toy_checkpoint):
    runner = _resume(tmp_path, toy_checkpoint, 'RZToyWithBuffer', resume_strict=False)
    assert runner.iter == 4  # resumed at 2, trained 2 more


@pytest.mark.slow
def test_resume_strict_must_be_a_bool(tmp_path, toy_checkpoint):
    with pytest.raises(ValueError, match="resume_strict must be True or False, got 'no'"):
        _resume(tmp_path, toy_checkpoint, 'H4ToyRegressor', resume_strict='no')


@pytest.mark.slow
def test_matching_resume_is_unchanged(tmp_path, toy_checkpoint):
    assert _resume(tmp_path, toy_checkpoint, 'H4ToyRegressor').iter == 4


@pytest.mark.slow
def test_load_from_finetunes_leniently_with_a_summary(tmp_path, toy_checkpoint):
    cfg = toy_cfg(str(tmp_path), name='finetune', max_iters=1, model='H4ToyWithUnused',
                  load_from=toy_checkpoint, trusted_checkpoints=[toy_checkpoint])
    runner = train(cfg)
    assert runner.iter == 1
    logs = ''.join(open(p).read() for p in glob.glob(str(tmp_path / '*' / '*.log')))
    assert (f"load_from {toy_checkpoint!r} (fine-tuning, loaded leniently): 2 missing, 0 "
            'unexpected, 0 shape-mismatched key(s)') in logs
    assert 'missing: unused_head.weight, unused_head.bias' in logs


def _test_config(tmp_path, model: str) -> str:
    cfg = toy_cfg(str(tmp_path / 'test_work'), name='evaluate', model=model)
    loader = dict(cfg.train_dataloader)
    cfg.merge_from_dict(dict(test_dataloader=loader, test_cfg=dict(type='TestLoop'),
                             test_evaluator=dict(type='RZToyMetric'),
                             custom_imports=dict(
                                 imports=['tests.reliability.test_resume'])))
    path = str(tmp_path / f'{model}.py')
    cfg.dump(path)
    return path


@pytest.mark.slow
def test_tools_test_refuses_to_score_a_mismatching_checkpoint(tmp_path, toy_checkpoint):
    config = _test_config(tmp_path, 'H4ToyWithBN')
    proc = subprocess.run(
        [sys.executable, 'tools/test.py', config, toy_checkpoint, '--trust-checkpoint',
         toy_checkpoint], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode != 0
    assert 'never a meaningful result' in proc.stderr
    assert f'checkpoint {toy_checkpoint!r} does not match the model H4ToyWithBN' \
        in proc.stderr
    assert 'resume_strict=False' in proc.stderr
    # asked for explicitly: it evaluates
    metrics = cli.test_main([config, toy_checkpoint, '--trust-checkpoint', toy_checkpoint,
                         '--cfg-options', 'resume_strict=False'])
    assert 'RZToyMetric/mean_pred' in metrics or 'mean_pred' in str(metrics)
