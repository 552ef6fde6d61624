"""``optim_wrapper.optimizer.fused=True``: checked at start-up with clear errors, and a
real mmdet3d model trains and resumes with it as with the default multi-tensor step
(to float rounding)."""
import os
import uuid

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import RUNNERS

import mmdet3d_scaling  # noqa: F401
from mmdet3d_scaling.config import prepare_config
from mmdet3d_scaling.config.fused_optimizer import check_fused_optimizer
from mmdet3d_scaling.datasets.synthetic.kitti import write_kitti

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(ROOT, 'configs', 'demo', 'pointpillars_synthetic_kitti_cpu.py')
DEVICES = ['cpu'] + (['cuda'] if torch.cuda.is_available() else [])


def _cfg(**optimizer) -> Config:
    return Config(dict(optim_wrapper=dict(type='OptimWrapper', optimizer=optimizer)))


def test_absent_or_false_is_no_line():
    assert check_fused_optimizer(Config()) is None
    assert check_fused_optimizer(_cfg(type='AdamW', lr=1e-3)) is None
    assert check_fused_optimizer(_cfg(type='AdamW', lr=1e-3, fused=False)) is None


def test_a_fused_adamw_gets_its_start_up_line():
    line = check_fused_optimizer(_cfg(type='AdamW', lr=1e-3, weight_decay=0.01, fused=True))
    assert line.startswith('optimizer step: fused AdamW (optim_wrapper.optimizer.fused=True')
    assert check_fused_optimizer(_cfg(type=torch.optim.SGD, lr=0.1, fused=True))


def test_prepare_config_prints_the_line_and_keeps_the_key(capsys):
    from mmengine.logging import MMLogger
    MMLogger.get_instance(f'fused_{uuid.uuid4().hex}')  # a current logger to print to
    cfg = prepare_config(_cfg(type='AdamW', lr=1e-3, fused=True))
    assert cfg.optim_wrapper.optimizer.fused is True
    assert 'optimizer step: fused AdamW' in capsys.readouterr().out


@pytest.mark.parametrize('optimizer,message', [
    (dict(type='RMSprop', lr=1e-3, fused=True),
     r'fused=True: RMSprop has no fused step \(torch has one for Adam, AdamW, SGD and '
     r'Adagrad\); remove the key'),
    (dict(type='AdamW', lr=1e-3, fused=True, foreach=True),
     r'fused=True and optim_wrapper.optimizer.foreach=True: .*remove foreach'),
    (dict(type='NoSuchOptimizer', lr=1e-3, fused=True),
     r"optimizer type 'NoSuchOptimizer' is not registered"),
])
def test_what_cannot_work_is_named(optimizer, message):
    with pytest.raises(ValueError, match=message):
        check_fused_optimizer(Config(dict(optim_wrapper=dict(optimizer=optimizer))))


@pytest.mark.parametrize('device', DEVICES)
def test_fused_adamw_steps_as_the_multi_tensor_step(device):
    """The recipes' AdamW (betas, weight decay) over 30 steps: the same parameters to
    float rounding, and the same state-dict layout."""
    torch.manual_seed(0)
    start = [torch.randn(64, 33, device=device) for _ in range(6)]
    grads = [[torch.randn_like(p) for p in start] for _ in range(30)]
    out = {}
    for fused in (False, True):
        params = [torch.nn.Parameter(p.clone()) for p in start]
        opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.95, 0.99), weight_decay=0.01,
                                fused=fused)
        for step in grads:
            for p, g in zip(params, step):
                p.grad = g.clone()
            opt.step()
        out[fused] = (params, opt.state_dict())
    for a, b in zip(out[False][0], out[True][0]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    state = out[True][1]['state'][0]
    assert set(state) == set(out[False][1]['state'][0]) == {'step', 'exp_avg', 'exp_avg_sq'}
    assert float(state['step']) == 30


# ------------------------------------------------------------ a real model (the demo)
@pytest.fixture(scope='module')
def demo_workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp('fused')
    write_kitti(str(root / 'data' / 'synthetic_kitti'), 4, 1, seed=0, progress=False)
    return root


def _demo_runner(root, work: str, fused: bool, iters: int, resume: bool = False):
    cfg = Config.fromfile(DEMO)
    cfg.work_dir = str(root / work)
    cfg.experiment_name = f'fused_{uuid.uuid4().hex}'
    cfg.optim_wrapper.optimizer.fused = fused
    cfg.train_cfg.max_iters = iters
    cfg.train_cfg.val_interval = 10 ** 6
    cfg.param_scheduler = []  # a constant LR: the stop-and-resume run follows the same
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', by_epoch=False,
                                        interval=2, save_last=True)
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=1)
    cfg.train_dataloader.update(batch_size=2, num_workers=0, persistent_workers=False)
    cfg.randomness = dict(seed=0, deterministic=False)
    cfg.resume = resume
    cfg.val_dataloader = cfg.val_cfg = cfg.val_evaluator = None
    cfg.test_dataloader = cfg.test_cfg = cfg.test_evaluator = None
    return RUNNERS.build(cfg)


def _params(runner):
    return {n: p.detach().clone() for n, p in runner.model.named_parameters()}


@pytest.mark.slow
def test_the_demo_steps_fused_as_with_the_default_step(demo_workspace, monkeypatch):
    """PointPillars, one step from one seed: fused and default reach the same weights to
    float rounding. (Over several steps the rounding differences of the first step grow
    through the model, as between any two kernels: after 4 steps up to 4 % of the LR.)"""
    monkeypatch.chdir(demo_workspace)
    ends = {}
    for fused in (False, True):
        runner = _demo_runner(demo_workspace, f'straight_{fused}', fused, iters=1)
        runner.train()
        ends[fused] = _params(runner)
        assert runner.optim_wrapper.optimizer.defaults['fused'] is fused
    for name, value in ends[False].items():
        torch.testing.assert_close(ends[True][name], value, rtol=1e-5, atol=1e-7,
                                   msg=lambda m: f'{name}: {m}')


@pytest.mark.slow
@pytest.mark.parametrize('first', [False, True], ids=['default then fused',
                                                      'fused then default'])
def test_a_checkpoint_resumes_into_the_other_step(demo_workspace, monkeypatch, first):
    """A checkpoint of 2 steps resumes into a run of the other kind with the optimizer
    state it saved (moments and step counts equal), then trains on to step 4."""
    monkeypatch.chdir(demo_workspace)
    work = f'resumed_{first}'
    _demo_runner(demo_workspace, work, first, iters=2).train()
    saved = torch.load(demo_workspace / work / 'iter_2.pth', map_location='cpu',
                       weights_only=False)['optimizer']['state']
    runner = _demo_runner(demo_workspace, work, not first, iters=2, resume=True)
    runner.train()  # loads iter_2.pth; nothing left to train
    opt = runner.optim_wrapper.optimizer
    assert opt.defaults['fused'] is (not first)
    loaded = opt.state_dict()['state']
    assert loaded.keys() == saved.keys() and saved
    for key, state in saved.items():
        assert float(loaded[key]['step']) == float(state['step']) == 2.0
        for moment in ('exp_avg', 'exp_avg_sq'):
            assert torch.equal(loaded[key][moment].cpu(), state[moment])
    runner = _demo_runner(demo_workspace, work, not first, iters=4, resume=True)
    runner.train()
    assert {float(s['step']) for s in runner.optim_wrapper.optimizer.state.values()} == {4.0}
