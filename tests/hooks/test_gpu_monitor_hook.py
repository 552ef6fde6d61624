"""GPUMonitorHook with a real mmengine Runner (CPU here; the CUDA test runs on a GPU)."""
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from mmengine.hooks import Hook
from mmengine.runner import Runner

import mmdet3d_scaling  # noqa: F401  (registers the hook)
from mmdet3d.registry import HOOKS
from mmdet3d_scaling.hooks.gpu_monitor_hook import (GPUMonitorHook, batch_size_of,
                                                    local_memory_warning)
from tests.toy import ToyDataset, ToyRegressor, toy_runner_cfg

NO_GPU_MESSAGE = 'GPUMonitorHook: no CUDA device in use'
STARVED_MESSAGE = 'the data loader starves training'


class SlowDataset(ToyDataset):
    """ToyDataset whose samples take ``delay`` seconds to load."""

    def __init__(self, delay: float, **kwargs):
        super().__init__(**kwargs)
        self.delay = delay

    def __getitem__(self, idx: int) -> dict:
        time.sleep(self.delay)
        return super().__getitem__(idx)


def _runner(work_dir, dataset=None, max_iters=8, batch_size=2, log_interval=2,
            hook=None, **overrides) -> Runner:
    # A unique experiment name: runners built in the same second would otherwise share
    # mmengine's MessageHub / MMLogger instances (named by timestamp).
    cfg = toy_runner_cfg(work_dir, max_iters=max_iters, batch_size=batch_size,
                         log_level='INFO', default_scope='mmdet3d',
                         experiment_name=f'gpu_monitor_{uuid.uuid4().hex[:8]}', **overrides)
    if dataset is not None:
        cfg['train_dataloader']['dataset'] = dataset
    cfg['default_hooks']['logger'] = dict(type='LoggerHook', interval=log_interval)
    cfg['custom_hooks'] = [hook if hook is not None else dict(type='GPUMonitorHook')]
    return Runner(**cfg)


def _json_lines(runner: Runner) -> list:
    path = Path(runner.log_dir) / 'vis_data' / f'{runner.timestamp}.json'
    return [json.loads(line) for line in path.read_text().splitlines()]


def _log_text(runner: Runner) -> str:
    return (Path(runner.log_dir) / f'{runner.timestamp}.log').read_text()


def test_registered_and_validates_options():
    assert HOOKS.get('GPUMonitorHook') is GPUMonitorHook
    with pytest.raises(ValueError, match='interval.*0'):
        GPUMonitorHook(interval=0)
    with pytest.raises(ValueError, match='starvation_threshold.*1.5'):
        GPUMonitorHook(starvation_threshold=1.5)
    with pytest.raises(ValueError, match='starvation_warn_every'):
        GPUMonitorHook(starvation_warn_every=0)


def test_kept_local_memory_is_named_above_a_gibibyte():
    """What mmcv's strided sparse conv keeps on an H100 (16,866 MiB) is named with the
    way out; small or unknown amounts are not."""
    assert local_memory_warning(None, 10) is None
    assert local_memory_warning(512.0, 10) is None
    text = local_memory_warning(16866.0, 10)
    assert '16.5 GiB' in text and 'iteration 10' in text
    assert 'spconv' in text and 'failure_modes.md#memory' in text


def test_batch_size_from_common_batch_layouts():
    assert batch_size_of(dict(inputs=torch.zeros(3, 4), targets=torch.zeros(3))) == 3
    assert batch_size_of(dict(inputs=dict(points=[torch.zeros(5, 4)] * 2),
                              data_samples=[object()] * 2)) == 2
    assert batch_size_of(dict(inputs=dict(points=[torch.zeros(5, 4)] * 4))) == 4
    assert batch_size_of(object()) is None


@pytest.mark.slow
def test_keys_reach_message_hub_and_json_log(tmp_path):
    runner = _runner(tmp_path, max_iters=8, batch_size=2, log_interval=4)
    runner.train()
    hub = runner.message_hub
    wait = hub.get_scalar('train/gpu_data_wait_share').current()
    rate = hub.get_scalar('train/gpu_samples_per_s').current()
    assert 0 <= wait <= 1 and rate > 0
    assert hub.get_scalar('train/gpu_samples_per_s_global').current() == rate  # 1 rank
    # One value per report: iterations 4 and 8.
    assert len(hub.get_scalar('train/gpu_samples_per_s').data[0]) == 2
    logged = [line for line in _json_lines(runner) if 'gpu_samples_per_s' in line]
    assert [line['step'] for line in logged] == [4, 8]
    assert all('gpu_data_wait_share' in line for line in logged)
    assert 'gpu_samples_per_s:' in _log_text(runner)
    if not torch.cuda.is_available():
        assert not any(k.startswith('train/gpu_mem') for k in hub.log_scalars)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason='checks the no-GPU path')
def test_no_gpu_message_appears_once(tmp_path):
    dataset = ToyDataset(length=4)
    runner = _runner(tmp_path, dataset=dataset, max_iters=8, batch_size=2,
                     log_interval=2, train_cfg=dict(by_epoch=True, max_epochs=4))
    runner.train()
    assert _log_text(runner).count(NO_GPU_MESSAGE) == 1
    assert runner.message_hub.get_scalar('train/gpu_samples_per_s').current() > 0


@pytest.mark.slow
def test_slow_loader_raises_data_wait_and_warns(tmp_path):
    # 6 reports (every 2 iterations), a warning at most every 4 reports: 2 warnings.
    hook = dict(type='GPUMonitorHook', starvation_threshold=0.2, starvation_warn_every=4)
    slow = _runner(tmp_path / 'slow', dataset=SlowDataset(0.05, length=32), max_iters=12,
                   batch_size=1, log_interval=2, hook=hook)
    slow.train()
    slow_share = slow.message_hub.get_scalar('train/gpu_data_wait_share').current()
    assert slow_share > 0.5  # 50 ms of sleep against a 4-parameter model
    assert _log_text(slow).count(STARVED_MESSAGE) == 2

    fast = _runner(tmp_path / 'fast', max_iters=12, batch_size=1, log_interval=2,
                   hook=dict(type='GPUMonitorHook', starvation_threshold=0.99))
    fast.train()
    fast_share = fast.message_hub.get_scalar('train/gpu_data_wait_share').current()
    assert fast_share < slow_share
    assert STARVED_MESSAGE not in _log_text(fast)


@pytest.mark.slow
def test_own_interval_overrides_logger_interval(tmp_path):
    runner = _runner(tmp_path, max_iters=6, log_interval=1,
                     hook=dict(type='GPUMonitorHook', interval=3))
    runner.train()
    assert len(runner.message_hub.get_scalar('train/gpu_samples_per_s').data[0]) == 2


REPO = Path(__file__).resolve().parents[2]
DEMO_CONFIG = REPO / 'configs' / 'demo' / 'pointpillars_synthetic_kitti_cpu.py'
PLOT_TOOL = REPO / 'tools' / 'analysis' / 'plot_gpu_monitor.py'


@pytest.mark.slow
@pytest.mark.skipif(not DEMO_CONFIG.is_file(), reason='demo config not in this checkout')
def test_real_pointpillars_config(tmp_path, monkeypatch):
    """The hook in a stock-style mmdet3d config: PointPillars on synthetic KITTI."""
    from mmengine.config import Config

    from mmdet3d_scaling.datasets.synthetic.kitti import write_kitti
    monkeypatch.chdir(tmp_path)  # the config's data_root is relative
    write_kitti('data/synthetic_kitti', train_frames=4, val_frames=1, progress=False)
    cfg = Config.fromfile(str(DEMO_CONFIG))
    cfg.work_dir = str(tmp_path / 'work')
    cfg.train_cfg.max_iters = 2
    cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    cfg.param_scheduler = []
    cfg.train_dataloader.batch_size = 2
    cfg.train_dataloader.num_workers = 0
    cfg.train_dataloader.persistent_workers = False
    cfg.default_hooks.logger.interval = 1
    cfg.default_hooks.visualization = dict(type='Det3DVisualizationHook', draw=False)
    cfg.custom_hooks = [dict(type='GPUMonitorHook')]
    # The visualizer is a process-wide singleton by name: a fixed name would reuse an
    # earlier test's instance, which writes its JSON log into that test's directory.
    cfg.visualizer.pop('name', None)
    runner = Runner.from_cfg(cfg)
    runner.train()
    logged = [line for line in _json_lines(runner) if 'gpu_samples_per_s' in line]
    assert [line['step'] for line in logged] == [1, 2]
    assert all(line['gpu_samples_per_s'] > 0 for line in logged)
    assert all(0 <= line['gpu_data_wait_share'] <= 1 for line in logged)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def _ddp_worker(rank: int, work_dir: str, port: int) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE='2',
                      MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    if torch.cuda.is_available():  # one GPU a rank, NCCL: the gather runs on CUDA
        placement = dict(env_cfg=dict(dist_cfg=dict(backend='nccl')))
    else:  # CPU DDP: gloo, no device_ids (what the plugin's config step sets)
        placement = dict(cfg=dict(model_wrapper_cfg=dict(type='MMDistributedDataParallel',
                                                         device_ids=None)))
    # Rank 1 loads slowly: it is the straggler the cross-rank figures must name.
    dataset = SlowDataset(0.03 if rank == 1 else 0.0, length=24)  # 6 iterations a rank
    runner = _runner(work_dir, dataset=dataset, max_iters=6, batch_size=2, log_interval=3,
                     launcher='pytorch', **placement)
    runner.train()
    hub = runner.message_hub
    values = {k: v.current() for k, v in hub.log_scalars.items() if 'gpu_' in k}
    values['reports'] = len(hub.get_scalar('train/gpu_samples_per_s_min').data[0])
    Path(work_dir, f'rank{rank}.json').write_text(json.dumps(values))


@pytest.mark.slow
@pytest.mark.skipif(0 < torch.cuda.device_count() < 2, reason='needs 0 or >= 2 GPUs')
def test_across_ranks_min_max_with_two_processes(tmp_path):
    # CPU: gloo, forked so the children inherit the imported stack (seconds, not a
    # minute). GPUs: NCCL, spawned (CUDA cannot be used in a forked child).
    method = 'spawn' if torch.cuda.is_available() else 'fork'
    mp.start_processes(_ddp_worker, args=(str(tmp_path), _free_port()), nprocs=2,
                       join=True, start_method=method)
    ranks = [json.loads((tmp_path / f'rank{r}.json').read_text()) for r in (0, 1)]
    for values in ranks:
        assert values['reports'] == 2  # one gather per report, not per iteration
        assert values['train/gpu_data_wait_share_max_rank'] == 1
        assert (values['train/gpu_data_wait_share_max']
                > values['train/gpu_data_wait_share_min'])
        assert values['train/gpu_samples_per_s_global'] == pytest.approx(
            values['train/gpu_samples_per_s_min'] + values['train/gpu_samples_per_s_max'])
    # Every rank logs the same spread, and its own figure lies inside it.
    assert ranks[0]['train/gpu_data_wait_share_max'] == ranks[1][
        'train/gpu_data_wait_share_max']
    for values in ranks:
        assert (values['train/gpu_data_wait_share_min'] <= values['train/gpu_data_wait_share']
                <= values['train/gpu_data_wait_share_max'])
    # The plot tool draws the spread from this real 2-rank log (here, to spawn once).
    plots = tmp_path / 'plots'
    result = subprocess.run([sys.executable, str(PLOT_TOOL), str(tmp_path), '--out-dir',
                             str(plots)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert (plots / 'across_ranks.png').read_bytes().startswith(b'\x89PNG')


class _Spiky(ToyRegressor):
    """Allocates ``spike_mb`` of CUDA memory for a moment in iteration ``spike_iter``."""

    def __init__(self, spike_iter: int, spike_mb: int):
        super().__init__()
        self.spike_iter, self.spike_mb, self.calls = spike_iter, spike_mb, 0

    def forward(self, inputs, targets=None, mode='tensor'):
        if mode == 'loss':
            self.calls += 1
            if self.calls == self.spike_iter + 1:
                spike = torch.empty(self.spike_mb * 1024 * 1024, dtype=torch.uint8,
                                    device=self.linear.weight.device)
                del spike
        return super().forward(inputs, targets, mode)


@pytest.mark.slow
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')
def test_peak_between_reports_survives_logger_resets(tmp_path):
    # Reports every 4 iterations, LoggerHook resets the peak every 2: the spike in
    # iteration 1 happens before the logger's reset at iteration 2 and must still be
    # in the report at iteration 4.
    runner = _runner(tmp_path, max_iters=4, log_interval=2, model=_Spiky(1, 256),
                     hook=dict(type='GPUMonitorHook', interval=4))
    runner.train()
    hub = runner.message_hub
    assert hub.get_scalar('train/gpu_mem_peak_mb').current() >= 256
    assert hub.get_scalar('train/gpu_mem_alloc_mb').current() < 256
    for key in ('util_pct', 'nvml_mem_used_mb', 'power_w', 'temp_c'):
        assert f'train/gpu_{key}' in hub.log_scalars, key


class _SyncGuard:
    """Two hooks around GPUMonitorHook (priority 55) that make any CUDA sync an error."""

    def __init__(self):
        from mmengine.hooks import Hook

        class Enter(Hook):
            priority = 54

            def before_train_iter(self, runner, batch_idx, data_batch=None):
                torch.cuda.set_sync_debug_mode('error')

            def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
                torch.cuda.set_sync_debug_mode('error')

        class Leave(Hook):
            priority = 56

            def before_train_iter(self, runner, batch_idx, data_batch=None):
                torch.cuda.set_sync_debug_mode('default')

            def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
                torch.cuda.set_sync_debug_mode('default')

        self.hooks = [Enter(), Leave()]


@pytest.mark.slow
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')
def test_no_cuda_sync_in_the_hook(tmp_path):
    # Reports (memory counters, NVML) included: single process, so no gather either.
    runner = _runner(tmp_path, max_iters=4, log_interval=2)
    for hook in _SyncGuard().hooks:
        runner.register_hook(hook)
    runner.train()
    assert 'train/gpu_mem_peak_mb' in runner.message_hub.log_scalars


# ------------------------------------------------------- AMP: skipped optimizer steps
SKIPPED_MESSAGE = 'were skipped by loss scaling'


class InfAt(ToyDataset):
    """ToyDataset whose samples ``bad`` have infinite inputs: inf loss, inf gradients."""

    def __init__(self, bad, **kwargs):
        super().__init__(**kwargs)
        self.bad = set(bad)

    def __getitem__(self, idx: int) -> dict:
        sample = super().__getitem__(idx)
        if idx in self.bad:
            sample['inputs'] = torch.full_like(sample['inputs'], float('inf'))
        return sample


class RealScaler(Hook):
    """Gives the AmpOptimWrapper a real, enabled GradScaler before the monitor attaches.

    On this CPU machine patches/cpu/amp_cpu.py builds AmpOptimWrapper with loss scaling off;
    torch's CPU GradScaler runs the same scale / unscale / skip / update code as CUDA's.
    """

    priority = 'VERY_HIGH'

    def __init__(self, static=None, **scaler_kwargs):
        self.static = static  # mmengine's loss_scale=<float>: update() resets to it
        self.kwargs = scaler_kwargs

    def before_train(self, runner):
        device = 'cuda' if torch.cuda.is_available() else 'cpu'
        runner.optim_wrapper.loss_scaler = torch.amp.GradScaler(device, **self.kwargs)
        runner.optim_wrapper._scale_update_param = self.static


def _amp_runner(tmp_path, bad, accumulation=1, max_iters=8, scaler=None, **hook):
    runner = _runner(tmp_path, dataset=InfAt(bad, length=16), max_iters=max_iters,
                     batch_size=2, log_interval=4,
                     hook=dict(type='GPUMonitorHook', **hook),
                     optim_wrapper=dict(type='AmpOptimWrapper', accumulative_counts=
                                        accumulation, optimizer=dict(type='SGD', lr=0.1)))
    runner.register_hook(RealScaler(**(scaler or dict(init_scale=4.0,
                                                      growth_interval=1000))))
    return runner


def _amp_series(runner, key):
    return [float(v) for v in runner.message_hub.get_scalar(f'train/amp/{key}').data[0]]


@pytest.mark.slow
@pytest.mark.parametrize('accumulation, bad, skipped, in_interval, scales', [
    # iterations 0-7, batch 2: samples 4-5 are iteration 2 (report after iteration 4)
    (1, [4], [1, 1], [1, 0], [2.0, 2.0]),
    # windows of 2 micro-batches: iteration 2 spoils the window 2-3; 6 -> window 6-7
    (2, [4, 13], [1, 2], [1, 1], [2.0, 1.0]),
])
def test_skipped_steps_counted_from_real_overflows(tmp_path, accumulation, bad, skipped,
                                                   in_interval, scales):
    runner = _amp_runner(tmp_path, bad, accumulation=accumulation)
    runner.train()
    assert _amp_series(runner, 'skipped_steps') == skipped
    assert _amp_series(runner, 'skipped_steps_interval') == in_interval
    assert _amp_series(runner, 'grad_scale') == scales  # halved at each overflow
    logged = [line for line in _json_lines(runner) if 'amp/skipped_steps' in line]
    assert [line['amp/skipped_steps'] for line in logged] == skipped
    assert [line['amp/grad_scale'] for line in logged] == scales  # not window-averaged
    assert all(torch.isfinite(p).all() for p in runner.model.parameters())
    assert SKIPPED_MESSAGE not in _log_text(runner)


@pytest.mark.slow
def test_static_loss_scale_skips_are_counted(tmp_path):
    # A fixed scale (mmengine: loss_scale=512.) never changes, so only the step count
    # can show the skips.
    runner = _amp_runner(tmp_path, [0, 1, 2, 3], scaler=dict(init_scale=512.0,
                                                            static=512.0))
    runner.train()
    assert _amp_series(runner, 'skipped_steps') == [2, 2]
    assert _amp_series(runner, 'grad_scale') == [512.0, 512.0]


@pytest.mark.slow
def test_interval_with_every_step_skipped_warns(tmp_path):
    runner = _amp_runner(tmp_path, range(8), max_iters=8)  # iterations 0-3 all inf
    runner.train()
    assert _amp_series(runner, 'skipped_steps') == [4, 4]
    text = _log_text(runner)
    assert text.count(SKIPPED_MESSAGE) == 1
    assert 'all 4 optimizer steps up to iteration 4' in text


def test_no_amp_figures_without_loss_scaling(tmp_path):
    plain = _runner(tmp_path / 'plain', max_iters=4, log_interval=2)
    plain.train()
    assert not any(k.startswith('train/amp/') for k in plain.message_hub.log_scalars)
    assert 'no AmpOptimWrapper (no loss scaling): no amp/ figures' in _log_text(plain)
    off = _amp_runner(tmp_path / 'off', [4], scaler=dict(enabled=False), max_iters=4)
    off.train()
    assert not any(k.startswith('train/amp/') for k in off.message_hub.log_scalars)
    assert "loss scaling is off" in _log_text(off)
    muted = _amp_runner(tmp_path / 'muted', [4], amp=False, max_iters=4)
    muted.train()
    assert not any(k.startswith('train/amp/') for k in muted.message_hub.log_scalars)
