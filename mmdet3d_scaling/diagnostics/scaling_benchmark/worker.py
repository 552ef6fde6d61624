"""The process side of a scaling benchmark run: one training run, timed.

The orchestrator (:mod:`.launch`) starts this file as a script, ``python worker.py
SPEC_JSON`` (under ``torchrun`` for a distributed run), not as ``-m`` of the package:
importing ``mmdet3d_scaling`` applies the compat shims and wraps ``Runner.from_cfg``, and
a stock comparison run must train stock mmdet3d. So this module imports only the
standard library, torch and mmengine at the top, and the plugin where a plugin run
needs it (the spec's ``plugin`` key) or after training.

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
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from typing import Any, Dict, List, Optional  # noqa: E402

import torch  # noqa: E402
import torch.distributed as torch_dist  # noqa: E402
from mmengine.hooks import Hook  # noqa: E402


def host_facts() -> Dict[str, Any]:
    """What this process's main thread runs on: the CPUs it may use (a library that
    narrows the thread's affinity shows here), torch's intra-op threads and the
    process's thread count."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count()
    try:
        threads: Optional[int] = len(os.listdir('/proc/self/task'))
    except OSError:
        threads = None
    return dict(cpus_allowed=cpus, intra_op_threads=torch.get_num_threads(),
                process_threads=threads, omp_num_threads=os.environ.get('OMP_NUM_THREADS'))


def wait_for_peers(directory: str, count: int, timeout_s: float = 1800.0) -> None:
    """A file barrier for processes without a process group: announce this one in
    ``directory`` and return once ``count`` have."""
    os.makedirs(directory, exist_ok=True)
    open(os.path.join(directory, f'ready-{os.getpid()}'), 'w').close()
    deadline = time.monotonic() + timeout_s
    while len([n for n in os.listdir(directory) if n.startswith('ready-')]) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f'benchmark start barrier: {count} independent runs should reach their '
                f'measured window, only {len(os.listdir(directory))} did within '
                f'{timeout_s:.0f} s (barrier {directory}); see the other runs\' run.log '
                f'for the failure.')
        time.sleep(0.01)


class BenchmarkTimerHook(Hook):
    """Times the measured window of a benchmark run and gathers per-rank figures.

    Built by the worker and registered on the runner directly (no registry), so the same
    hook serves plugin and stock runs.

    Args:
        warmup_steps: optimizer steps excluded from the measurement.
        warmup_iters: at least this many loop iterations (micro-batches) of this process
            are excluded too, so that runs with different accumulation warm up alike
            (caching allocator, cuDNN autotuning, clocks). Defaults to 0.
        steps: optimizer steps measured.
        comm: 'on' (normal DDP), or 'off' (DDP all-reduce replaced by a no-op hook).
        result_path: JSON file rank 0 writes the gathered figures to.
        start_barrier: ``{'directory': ..., 'count': N, 'timeout_s': ...}``: wait before the
            measured window until N processes without a process group (the
            ``--independent`` runs) have reached theirs, so the windows overlap.
        intra_op_threads: torch's intra-op threads, set at the start of training so that
            plugin and stock runs use the same number whatever their construction did.
            None leaves the process's setting.
    """

    priority = 'LOWEST'  # after_train_iter last: logging/checkpointing count as step time

    def __init__(self, warmup_steps: int, steps: int, comm: str, result_path: str,
                 warmup_iters: int = 0,
                 start_barrier: Optional[Dict[str, Any]] = None,
                 intra_op_threads: Optional[int] = None) -> None:
        self.warmup_steps = warmup_steps
        self.intra_op_threads = intra_op_threads
        self.warmup_iters = warmup_iters
        self.steps = steps
        self.comm = comm
        self.result_path = result_path
        self.start_barrier = start_barrier
        self.accumulation = 1
        self._measure_from = 0
        self._t_start: Optional[float] = None
        self._t_end: Optional[float] = None
        self._window: List[float] = []  # wall clock (time.time) at start and end
        self._prev_end: Optional[float] = None
        self._wait_s = 0.0
        self._step_ends: List[float] = []  # host clock at each measured step's end
        self._iter_ends: List[float] = []  # ... and at each measured micro-batch's end
        self._samples = 0
        self._iters = 0
        self._cuda = False
        self.peak_mb = 0.0  # raised by PeakMemoryHook (the logger resets CUDA's counter)
        self.profile: Optional[Dict[str, Any]] = None  # set by ProfileHook
        self._host_start: Dict[str, Any] = {}

    def before_train(self, runner) -> None:
        import torch
        from mmengine.model import is_model_wrapper
        if self.intra_op_threads:
            torch.set_num_threads(self.intra_op_threads)
        self._host_start = host_facts()
        self.accumulation = int(getattr(runner.optim_wrapper, '_accumulative_counts', 1))
        self.warmup_steps = max(self.warmup_steps, -(-self.warmup_iters // self.accumulation))
        total_iters = (self.warmup_steps + self.steps) * self.accumulation
        runner.train_loop._max_iters = total_iters  # micro-batches
        # the wrapper sized its last accumulation window from the config's max_iters
        runner.optim_wrapper.initialize_count_status(runner.model, runner.iter,
                                                     total_iters)
        self._measure_from = self.warmup_steps * self.accumulation
        param = next(runner.model.parameters())
        self._cuda = param.device.type == 'cuda'
        if self.comm == 'off':
            model = runner.model
            if not (is_model_wrapper(model) and hasattr(model, 'register_comm_hook')):
                return  # single process: nothing is communicated anyway
            model.register_comm_hook(state=None, hook=_noop_allreduce)
        if self._cuda:
            torch.cuda.reset_peak_memory_stats(param.device)

    def _now(self) -> float:
        if self._cuda:
            import torch
            torch.cuda.synchronize()
        return time.perf_counter()

    def before_train_iter(self, runner, batch_idx: int, data_batch: Any = None) -> None:
        it = runner.iter
        if it == self._measure_from:
            if self.start_barrier:
                wait_for_peers(**self.start_barrier)
            self._t_start = self._now()
            self._window = [time.time()]
            self._step_ends = [self._t_start]
            self._iter_ends = [self._t_start]
            self._prev_end = None
            if self._cuda:
                import torch
                torch.cuda.reset_peak_memory_stats()
        elif it > self._measure_from and self._prev_end is not None:
            self._wait_s += time.perf_counter() - self._prev_end

    def after_train_iter(self, runner, batch_idx: int, data_batch: Any = None,
                         outputs: Any = None) -> None:
        it = runner.iter  # not yet incremented
        if it < self._measure_from:
            return
        self._iters += 1
        self._samples += _batch_size(data_batch)
        if it + 1 == runner.train_loop.max_iters:
            self._t_end = self._now()
            self._window.append(time.time())
        self._prev_end = time.perf_counter()
        self._iter_ends.append(self._t_end or self._prev_end)
        if (it + 1) % self.accumulation == 0:
            # host time; the loss is read back (.item()) every iteration, so it follows
            # the GPU closely enough for the spread of step times
            self._step_ends.append(self._t_end or self._prev_end)

    def after_train(self, runner) -> None:
        import torch
        from mmengine.dist import all_gather_object, get_rank, get_world_size
        mine = dict(
            rank=get_rank(),
            seconds=(self._t_end or math.nan) - (self._t_start or math.nan),
            iters=self._iters,
            samples=self._samples,
            data_wait_s=self._wait_s,
            window=self._window,  # wall clock: comparable across processes of a machine
            step_seconds=[round(b - a, 5) for a, b in zip(self._step_ends,
                                                          self._step_ends[1:])],
            iter_seconds=[round(b - a, 5) for a, b in zip(self._iter_ends,
                                                          self._iter_ends[1:])],
            peak_mem_mb=(max(self.peak_mb, torch.cuda.max_memory_allocated() / 2**20)
                         if self._cuda else None),
            host=dict(host_facts(), cpus_allowed_at_start=self._host_start['cpus_allowed']),
        )
        if self.profile is not None:
            mine['profile'] = self.profile
        ranks = all_gather_object(mine)
        if get_rank() != 0:
            return
        result = dict(
            world_size=get_world_size(),
            accumulation=self.accumulation,
            per_gpu_batch=runner.train_dataloader.batch_size,
            warmup_steps=self.warmup_steps,
            steps=self.steps,
            comm=self.comm,
            dataset_len=len(runner.train_dataloader.dataset),
            device=_device_name(self._cuda),
            ranks=ranks,
            gpu_monitor=_gpu_monitor_log(runner.log_dir),
        )
        with open(self.result_path, 'w') as f:
            json.dump(result, f, indent=1)


class PeakMemoryHook(Hook):
    """Reads the CUDA peak before mmengine's LoggerHook resets it at each log interval.

    Args:
        timer: the run's :class:`BenchmarkTimerHook`, whose ``peak_mb`` it raises.
    """

    priority = 'VERY_HIGH'  # after_train_iter before LoggerHook (BELOW_NORMAL)

    def __init__(self, timer: BenchmarkTimerHook) -> None:
        self.timer = timer

    def after_train_iter(self, runner, batch_idx: int, data_batch: Any = None,
                         outputs: Any = None) -> None:
        if self.timer._cuda and runner.iter >= self.timer._measure_from:
            self.timer.peak_mb = max(self.timer.peak_mb,
                                     torch.cuda.max_memory_allocated() / 2**20)


class ProfileHook(Hook):
    """Runs ``torch.profiler`` over the measured window of a profiling run and hands the
    per-iteration summary (:func:`mmdet3d_scaling.diagnostics.profiling.summarize_profile`:
    host synchronisations, collective time, top operators) to the timer.

    Args:
        timer: the run's :class:`BenchmarkTimerHook` (knows the window).
        trace_dir: where each rank writes a Chrome trace; None: no trace.
    """

    priority = 'VERY_LOW'

    def __init__(self, timer: BenchmarkTimerHook, trace_dir: Optional[str] = None) -> None:
        self.timer = timer
        self.trace_dir = trace_dir
        self._prof: Any = None
        self._syncs: Any = None
        self._t0 = 0.0

    def before_train_iter(self, runner, batch_idx: int, data_batch: Any = None) -> None:
        if runner.iter != self.timer._measure_from:
            return
        from torch.profiler import ProfilerActivity, profile

        # imported here: the stock comparison run must not load the plugin early
        from mmdet3d_scaling.diagnostics.host_reads import SyncSiteRecorder
        activities = [ProfilerActivity.CPU]
        if self.timer._cuda:
            activities.append(ProfilerActivity.CUDA)
        # with_stack: Python frames as parent events, so host waits get call sites
        self._prof = profile(activities=activities, with_stack=True)
        # on CUDA the call sites come from torch's sync debug mode (see SyncSiteRecorder)
        self._syncs = SyncSiteRecorder() if self.timer._cuda else None
        if self._syncs is not None:
            self._syncs.__enter__()
        self._prof.start()
        self._t0 = time.perf_counter()

    def after_train_iter(self, runner, batch_idx: int, data_batch: Any = None,
                         outputs: Any = None) -> None:
        if self._prof is None or runner.iter + 1 != runner.train_loop.max_iters:
            return
        if self.timer._cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - self._t0
        self._prof.stop()
        iters = runner.iter + 1 - self.timer._measure_from
        sites = None  # on CUDA: the recorder's, else the profiler's own
        if self._syncs is not None:
            self._syncs.__exit__(None, None, None)
            sites, self._syncs = self._syncs.sites(iters), None
        from mmdet3d_scaling.diagnostics.profiling import summarize_profile
        self.timer.profile = summarize_profile(self._prof, iters, wall)
        if sites is not None:
            self.timer.profile['sync_sites'] = sites
        if self.trace_dir:
            from mmengine.dist import get_rank
            os.makedirs(self.trace_dir, exist_ok=True)
            self._prof.export_chrome_trace(
                os.path.join(self.trace_dir, f'trace_rank{get_rank()}.json'))
        self._prof = None


class ProgressFileHook(Hook):
    """Writes ``{"done": micro-batches trained, "total": the run's micro-batches}`` to a
    JSON file, for the orchestrator's progress bar (:mod:`.tracking`).

    Written by the first process of each machine, at most every ``interval_s`` seconds
    and at the last iteration, through a temporary file and a rename, so a reader never
    sees half a file.

    Args:
        path: the JSON file.
        interval_s: least seconds between two writes. Defaults to 0.5.
    """

    priority = 'LOWEST'

    def __init__(self, path: str, interval_s: float = 0.5) -> None:
        self.path = path
        self.interval_s = interval_s
        self._last = -math.inf
        self._writer = os.environ.get('LOCAL_RANK', '0') == '0'

    def after_train_iter(self, runner, batch_idx: int, data_batch: Any = None,
                         outputs: Any = None) -> None:
        total = runner.train_loop.max_iters
        done = runner.iter + 1  # not yet incremented
        now = time.monotonic()
        if not self._writer or (done < total and now - self._last < self.interval_s):
            return
        self._last = now
        tmp = f'{self.path}.tmp'
        with open(tmp, 'w') as f:
            json.dump(dict(done=done, total=total), f)
        os.replace(tmp, self.path)


def _noop_allreduce(state: object,
                    bucket: torch_dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook that skips the all-reduce (gradients stay local)."""
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def _batch_size(data_batch: Any) -> int:
    if isinstance(data_batch, dict):
        samples = data_batch.get('data_samples')
        if isinstance(samples, (list, tuple)):
            return len(samples)
    raise ValueError('benchmark_scaling: cannot count the samples of a batch of type '
                     f'{type(data_batch).__name__}; expected mmdet3d\'s '
                     'dict(inputs=..., data_samples=[...]).')


def _device_name(cuda: bool) -> str:
    if cuda:
        import torch
        return f'{torch.cuda.get_device_name()} (x{torch.cuda.device_count()} visible)'
    return f'CPU {platform.processor() or platform.machine()} ({os.cpu_count()} cores)'


def _gpu_monitor_log(log_dir: str) -> Dict[str, float]:
    """The last GPUMonitorHook figures (``gpu_*`` keys) of the run's JSON scalar log."""
    path = os.path.join(log_dir, 'vis_data', 'scalars.json')
    if not os.path.exists(path):
        return {}
    last: Dict[str, float] = {}
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            found = {k: v for k, v in record.items() if 'gpu_' in k}
            if found:
                last = found
    return last


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
        import mmdet3d_scaling  # noqa: F401  (shims, registries, Runner.from_cfg wrapped)
        cfg = Config.fromfile(spec['config'])
        if spec.get('gpu_monitor', True):
            hooks = list(cfg.get('custom_hooks') or [])
            if not any(h.get('type') == 'GPUMonitorHook' for h in hooks):
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
    timer = BenchmarkTimerHook(spec['warmup'], spec['iters'], spec['comm'], spec['result'],
                               warmup_iters=spec.get('warmup_iters', 0),
                               start_barrier=spec.get('start_barrier'),
                               intra_op_threads=spec.get('intra_op_threads'))
    runner.register_hook(timer, priority='LOWEST')
    runner.register_hook(PeakMemoryHook(timer), priority='VERY_HIGH')
    if spec.get('profile'):
        runner.register_hook(ProfileHook(timer, spec.get('trace_dir')), priority='VERY_LOW')
    if spec.get('progress'):
        runner.register_hook(ProgressFileHook(spec['progress']), priority='LOWEST')
    runner.train()
    from mmdet3d_scaling.parallel.launcher import shutdown_distributed
    shutdown_distributed(runner)  # drops the DDP wrapper before the process group


if __name__ == '__main__':
    run_worker(sys.argv[1])
