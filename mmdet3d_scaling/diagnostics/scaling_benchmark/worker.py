"""The process side of a scaling benchmark run: one training run, timed.

The orchestrator (:mod:`.launch`) starts this file as a script, ``python worker.py
SPEC_JSON`` (under ``torchrun`` for a distributed run), not as ``-m`` of the package:
importing ``mmdet3d_scaling`` applies the patches and wraps ``Runner.from_cfg``, and
a stock comparison run must train stock mmdet3d. So this module imports only the
standard library at the top, the plugin where a plugin run needs it (the spec's
``plugin`` key), and its timing hooks (:mod:`mmdet3d_scaling.diagnostics.hooks`) with
:func:`plugin_module`, which leaves the plugin out of a stock run.

The spec (written by :func:`.launch.prepare_run`): config, cfg_options, warmup,
warmup_iters, iters, intra_op_threads, plugin, gpu_monitor, label, comm ('on' / 'off'),
work_dir, result
(the JSON rank 0 writes), and optionally progress (a JSON file of iterations done /
total for the progress bar), profile, trace_dir, start_barrier, ddp_one, and
for stock runs data_from, data_cfg_options, per_gpu_batch, accumulation.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))  # holds mmdet3d_scaling
if __name__ == '__main__':
    # run as a script: this folder must not shadow top-level modules (launch, tables...)
    sys.path[:] = [p for p in sys.path
                   if os.path.realpath(p or '.') != os.path.realpath(HERE)]

import copy  # noqa: E402
import importlib  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
from types import ModuleType  # noqa: E402
from typing import Any, Dict  # noqa: E402

PACKAGE = 'mmdet3d_scaling'


def plugin_module(name: str) -> ModuleType:
    """``mmdet3d_scaling.<name>``, without importing the plugin when a run has not.

    A stock run must train stock mmdet3d, and ``import mmdet3d_scaling`` registers the
    plugin's classes and applies its fixes. The timing hooks
    (:mod:`mmdet3d_scaling.diagnostics.hooks`) and the modules they use import only the
    standard library, torch and mmengine; so when the plugin is not imported, its
    package is entered without running its ``__init__`` and only the modules named are
    loaded. In a plugin run (the package imported) this is a plain import.
    """
    if PACKAGE not in sys.modules:
        spec = importlib.util.spec_from_loader(PACKAGE, None, is_package=True)
        spec.submodule_search_locations = [os.path.join(ROOT, PACKAGE)]
        sys.modules[PACKAGE] = importlib.util.module_from_spec(spec)
    return importlib.import_module(f'{PACKAGE}.{name}')


def add_timing_hooks(runner: Any, spec: Dict[str, Any]) -> None:
    """The benchmark's hooks on ``runner``: timer, peak memory, and the profiler and
    progress file when the spec asks for them."""
    timer = plugin_module('diagnostics.hooks.benchmark_timer_hook').BenchmarkTimerHook(
        spec['warmup'], spec['iters'], spec['comm'], spec['result'],
        warmup_iters=spec.get('warmup_iters', 0), start_barrier=spec.get('start_barrier'),
        intra_op_threads=spec.get('intra_op_threads'))
    runner.register_hook(timer, priority='LOWEST')
    peak = plugin_module('diagnostics.hooks.peak_memory_hook')
    runner.register_hook(peak.PeakMemoryHook(timer), priority='VERY_HIGH')
    if spec.get('profile'):
        profile = plugin_module('diagnostics.hooks.profile_hook')
        runner.register_hook(profile.ProfileHook(timer, spec.get('trace_dir')),
                             priority='VERY_LOW')
    if spec.get('progress'):
        progress = plugin_module('diagnostics.hooks.progress_file_hook')
        runner.register_hook(progress.ProgressFileHook(spec['progress']),
                             priority='LOWEST')


def _bench_overrides(cfg: Any, spec: Dict[str, Any]) -> None:
    """Fixed-length iteration-based training, no validation, checkpoints or schedules."""
    cfg.work_dir = spec['work_dir']
    cfg.train_cfg = dict(type='IterBasedTrainLoop',
                         max_iters=spec['warmup'] + spec['iters'],
                         val_interval=10**9)
    for key in ('val_cfg', 'val_dataloader', 'val_evaluator', 'test_cfg',
                'test_dataloader', 'test_evaluator'):
        cfg[key] = None
    cfg.param_scheduler = None  # the LR schedule does not change the speed
    # Full batches without epoch ends (no partial last batch, no loader restart), for
    # plugin and stock configs alike.
    sampler = cfg.train_dataloader.get('sampler') or {}
    cfg.train_dataloader.sampler = dict(type='InfiniteSampler',
                                        shuffle=sampler.get('shuffle', True))
    hooks = cfg.setdefault('default_hooks', {})
    hooks['checkpoint'] = None
    interval = max(1, min(10, spec['iters']))
    hooks['logger'] = dict(type='LoggerHook', interval=interval)
    cfg.log_processor = dict(by_epoch=False, window_size=interval)
    cfg.resume = False
    cfg.load_from = None
    if cfg.get('auto_scale_lr'):
        cfg.auto_scale_lr.enable = False


def _stock_config(spec: Dict[str, Any]) -> Any:
    """The stock config with the plugin config's dataset and the effective batch."""
    from mmengine.config import Config
    cfg = Config.fromfile(spec['config'], import_custom_modules=False)
    data = Config.fromfile(spec['data_from'], import_custom_modules=False)
    if spec.get('data_cfg_options'):
        data.merge_from_dict(spec['data_cfg_options'])
    cfg.train_dataloader.dataset = copy.deepcopy(data.train_dataloader.dataset)
    cfg.train_dataloader.batch_size = spec['per_gpu_batch']
    if spec['accumulation'] > 1:
        cfg.optim_wrapper.accumulative_counts = spec['accumulation']
    if spec.get('stock_settings') == 'equal':  # the plugin run's precision and loader
        if spec.get('num_workers') is not None:
            cfg.train_dataloader.num_workers = spec['num_workers']
            cfg.train_dataloader.persistent_workers = spec['num_workers'] > 0
        cfg.setdefault('env_cfg', {})['cudnn_benchmark'] = spec.get('cudnn_benchmark', False)
        if spec.get('float32_matmul_precision'):
            # the stock run's process, without the plugin (no ScalingRunner owns it):
            # one run, then the process ends
            import torch
            torch.set_float32_matmul_precision(spec['float32_matmul_precision'])
    return cfg


def run_worker(spec_path: str) -> None:
    """One benchmark run from its spec: build the runner (plugin or stock config), add
    the timing hooks, train; rank 0 writes the result."""
    with open(spec_path) as f:
        spec = json.load(f)
    sys.path.insert(0, ROOT)
    from mmengine.config import Config
    from mmengine.runner import Runner
    if spec['plugin']:
        import mmdet3d_scaling  # noqa: F401  (patches, registries, Runner.from_cfg wrapped)
        from mmdet3d_scaling.utils.registry_scope import type_name
        cfg = Config.fromfile(spec['config'])
        if spec.get('gpu_monitor', True):
            hooks = list(cfg.get('custom_hooks') or [])
            if not any(type_name(h.get('type')) == 'GPUMonitorHook' for h in hooks):
                hooks.append(dict(type='GPUMonitorHook'))
            cfg.custom_hooks = hooks
    else:
        cfg = _stock_config(spec)
    if spec['plugin'] and spec.get('cfg_options'):
        cfg.merge_from_dict(spec['cfg_options'])
    _bench_overrides(cfg, spec)
    # a DDP world of one (--ddp-one) runs the distributed code path in one process
    distributed = int(os.environ.get('WORLD_SIZE', '1')) > 1 or spec.get('ddp_one', False)
    cfg.launcher = 'pytorch' if distributed else 'none'
    runner = Runner.from_cfg(cfg)
    add_timing_hooks(runner, spec)
    runner.train()
    launcher = plugin_module('parallel.launcher')
    launcher.shutdown_distributed(runner)  # drops the DDP wrapper before the process group


if __name__ == '__main__':
    run_worker(sys.argv[1])
