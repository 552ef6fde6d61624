"""Config-selected patches and run settings (matmul precision, trusted checkpoints,
SIGTERM) last as long as the runner's command.

Two ScalingRunners in one process (a notebook, a sweep, a test session) on the demo's
real PointPillars and synthetic KITTI data: the first selects ``patches=['speed']``,
the second none. The second must build and train exactly as upstream does: no speed
patch in effect while it trains, and the same parameters and losses as the same config
trained by mmengine's own ``Runner`` (the route of a config without plugin keys).
"""
import copy

import pytest
import torch
from mmdet.models.task_modules.assigners import MaxIoUAssigner
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.registry import HOOKS, RUNNERS
from mmengine.runner import Runner

import mmdet3d_scaling  # noqa: F401
from mmdet3d_scaling import ScalingRunner
from mmdet3d_scaling.datasets.synthetic.kitti import write_kitti
from mmdet3d_scaling.patches import patching
from mmdet3d_scaling.patches.fixes.checkpoint import trusted_paths
from mmdet3d_scaling.patches.speed import max_iou_assigner
from tests.datasets.synthetic_helpers import demo_config
from tests.toy import toy_runner_cfg

pytestmark = pytest.mark.slow  # trains (a real detector three times, toys)

SPEED = set(patching.resolve(['speed']))
ITERS = 2


@HOOKS.register_module(force=True)
class PatchesSeenHook(Hook):
    """Records, at each training iteration, the patches in effect and the losses."""

    def __init__(self) -> None:
        self.applied, self.losses = [], []

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        self.applied.append(set(patching.applied()))
        self.assigner = MaxIoUAssigner.assign_wrt_overlaps

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self.losses.append({k: float(v.detach()) for k, v in outputs.items()})


@pytest.fixture(scope='module')
def kitti_root(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp('synthetic_kitti'))
    write_kitti(root, 16, 4, seed=0, progress=False)
    return root


def _cfg(root: str, work_dir, **extra) -> Config:
    """The demo config, 2 iterations of batch 2 in this process, no validation."""
    cfg = demo_config(root)
    cfg.work_dir = str(work_dir)
    cfg.train_dataloader.batch_size = 2
    cfg.train_dataloader.num_workers = 0
    cfg.train_dataloader.persistent_workers = False
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=ITERS, val_interval=10**6)
    cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    cfg.test_cfg = cfg.test_dataloader = cfg.test_evaluator = None
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', interval=10**6)
    del cfg.default_hooks['visualization']  # draws nothing here; a None is refused
    cfg.log_level = 'WARNING'
    cfg.custom_hooks = [dict(type='PatchesSeenHook')]
    cfg.merge_from_dict(extra)
    return cfg


def _train(runner) -> tuple:
    runner.train()
    seen = [h for h in runner.hooks if isinstance(h, PatchesSeenHook)][0]
    params = {k: v.detach().clone() for k, v in runner.model.state_dict().items()}
    return seen, params


@pytest.mark.slow
def test_a_stock_runner_after_a_speed_runner_trains_exactly_as_upstream(kitti_root,
                                                                         tmp_path):
    before = set(patching.applied())
    assert not SPEED & before

    fast = RUNNERS.build(_cfg(kitti_root, tmp_path / 'speed'))
    assert isinstance(fast, ScalingRunner) and fast.cfg.patches == ['speed']
    assert set(patching.applied()) == before, 'the build must not leave speed patches'
    seen_fast, _ = _train(fast)
    assert all(SPEED - {n for n in SPEED if n in patching.not_applied()} <= applied
               for applied in seen_fast.applied)
    assert seen_fast.assigner is max_iou_assigner.assign_wrt_overlaps
    assert set(patching.applied()) == before, 'train() must revert the speed patches'

    stock_cfg = _cfg(kitti_root, tmp_path / 'stock')
    stock_cfg.pop('patches')
    stock = RUNNERS.build(stock_cfg)
    assert isinstance(stock, ScalingRunner)
    seen_stock, params_stock = _train(stock)
    assert all(applied == before for applied in seen_stock.applied)
    assert seen_stock.assigner is max_iou_assigner.assign_wrt_overlaps.original

    upstream_cfg = _cfg(kitti_root, tmp_path / 'upstream')
    for key in ('patches', 'runner_type'):
        upstream_cfg.pop(key)
    upstream = Runner.from_cfg(upstream_cfg)  # no plugin keys: mmengine's own Runner
    assert type(upstream) is Runner
    seen_upstream, params_upstream = _train(upstream)

    assert seen_stock.losses == seen_upstream.losses
    assert params_stock.keys() == params_upstream.keys()
    for key, value in params_upstream.items():
        assert torch.equal(params_stock[key], value), key


@pytest.mark.slow
def test_val_and_test_apply_the_selection_only_while_they_run(tmp_path):
    cfg = Config(toy_runner_cfg(tmp_path, max_iters=2, runner_type='ScalingRunner',
                                patches=['max_iou_assigner']))
    cfg.custom_hooks = [dict(type='PatchesSeenHook')]
    runner = RUNNERS.build(cfg)
    assert 'max_iou_assigner' not in patching.applied()
    seen, _ = _train(runner)
    assert all('max_iou_assigner' in applied for applied in seen.applied)
    assert 'max_iou_assigner' not in patching.applied()


@pytest.mark.slow
def test_run_settings_are_restored_after_the_run(tmp_path):
    """Matmul precision and the trusted checkpoints of a config hold for its runner's
    commands only; the environment is never written."""
    import os
    torch.set_float32_matmul_precision('highest')
    ckpt = str(tmp_path / 'trusted.pth')
    cfg = Config(toy_runner_cfg(tmp_path, max_iters=2, runner_type='ScalingRunner',
                                float32_matmul_precision='high',
                                trusted_checkpoints=[ckpt]))
    seen = {}

    @HOOKS.register_module(force=True)
    class SettingsSeenHook(Hook):
        def before_train(self, runner) -> None:
            seen.update(precision=torch.get_float32_matmul_precision(),
                        trusted=trusted_paths())

    cfg.custom_hooks = [dict(type='SettingsSeenHook')]
    env_before = copy.copy(os.environ.get('MMDET3D_SCALING_TRUSTED_CHECKPOINTS'))
    runner = RUNNERS.build(cfg)
    assert torch.get_float32_matmul_precision() == 'highest'
    assert ckpt not in trusted_paths()
    runner.train()
    assert seen['precision'] == 'high' and ckpt in seen['trusted']
    assert torch.get_float32_matmul_precision() == 'highest'
    assert ckpt not in trusted_paths()
    assert os.environ.get('MMDET3D_SCALING_TRUSTED_CHECKPOINTS') == env_before


def test_sigterm_is_the_one_before_the_run_after_it(tmp_path):
    """SIGTERM's owners nest: the work-dir lock's handler, inside it PreemptionHook's
    while training; after train() the process has the handler it had before."""
    import signal

    def mine(signum, frame):
        pass

    seen = {}

    @HOOKS.register_module(force=True)
    class SignalSeenHook(Hook):
        def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
            seen['handler'] = signal.getsignal(signal.SIGTERM)

    saved = signal.signal(signal.SIGTERM, mine)
    try:
        cfg = Config(toy_runner_cfg(tmp_path, max_iters=2, runner_type='ScalingRunner',
                                    default_scope='mmdet3d',  # the plugin's registries
                                    experiment_name=f'sigterm_{tmp_path.name}'))
        cfg.custom_hooks = [dict(type='PreemptionHook'),
                            dict(type='SignalSeenHook')]
        RUNNERS.build(cfg).train()
        assert seen['handler'] not in (mine, signal.SIG_DFL)  # someone owned it meanwhile
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, saved)
