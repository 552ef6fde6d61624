"""Scaling benchmark: train a config for a fixed number of steps on 1..N GPUs, measure.

For each process count the tool starts a fresh training run (``torchrun`` for N > 1, a
plain process for 1) with the config's real data pipeline and the same effective batch
(the config's ``scaling`` key re-plans per-GPU batch and accumulation for every N),
trains ``--warmup`` + ``--iters`` optimizer steps and measures the last ``--iters``:

- time per optimizer step (= one effective batch) and per loop iteration (micro-batch),
- samples/s (all ranks), speedup and scaling efficiency = throughput_N / (N x throughput_1),
- data-wait share (time between iterations spent waiting for the loader, worst rank),
- peak memory per GPU (max over ranks) and the spread across ranks (samples/s, memory,
  data wait; the tool's own per-rank figures plus GPUMonitorHook's cross-rank min/max
  from the run's JSON log),
- micro-batch times (p50 / p90) and, from a 1-process run's, the lockstep bound: the
  efficiency N ranks would reach if each drew its micro-batch time from that run's and
  all waited for the slowest at every micro-batch (mean / E[max of N draws]),
- exposed gradient communication: for N > 1 a second run with DDP's all-reduce replaced
  by a no-op comm hook; comm time per step = step time (with) - step time (without).

Outputs under ``--out``: ``scaling.json`` (everything), ``scaling.md`` (a table like the
ones users publish) and ``scaling.png`` (samples/s and efficiency against N).

Profile mode (``--profile-steps K``): one more run per process count, K optimizer steps
under ``torch.profiler`` (after the same warm-up), summarised per rank and iteration:
host synchronisations (the CPU waiting for the GPU), time in collectives (NCCL kernels,
gloo / c10d calls), GPU kernel time against wall time, and the top operators. A second
table in ``scaling.md``; ``--profile-traces`` also writes a Chrome trace per rank.

Independent mode (``--independent``): for each N > 1, N single-GPU runs of the same
config at the same time, one GPU each, with no process group: no gradient all-reduce,
no SyncBN, no lockstep, only the shared host (CPU cores, memory bandwidth, PCIe, the
driver). Their summed samples/s is the ceiling the N-GPU run could reach on this
machine; ``ceiling efficiency`` = that sum / (N x the 1-GPU rate) and ``DDP cost`` =
1 - (N-GPU rate / that sum) separate what sharing the machine costs from what
distributed training costs (third table in ``scaling.md``).

DDP world of one (``--ddp-one``): the 1-process case once more through torchrun as a
distributed run of one process (process group, DDP wrapper, SyncBN conversion): what
the distributed code path costs by itself. With ``--independent`` it splits the N-GPU
run's loss into that cost, what sharing the machine costs, and the rest (waiting for
the other ranks).

Repeats (``--repeats R``): the timed runs of every process count R times, in rounds
whose order alternates (1,2 / 2,1 / ...), because a shared machine's speed drifts by
several per cent between runs a minute apart. The main table shows each count's median
run; a second table lists every round's samples/s and its efficiency against the same
round's 1-GPU run. Profile, independent and stock runs are made once, after the rounds.

Comparison mode (``--compare-stock STOCK_CONFIG``): the same model through stock mmdet3d
(its own config, the plugin not imported) against the plugin config, same dataset and
pipeline (taken from the plugin config, ``--cfg-options`` applied) and the same effective
batch, at ``--compare-nproc`` GPUs. The stock run keeps its own per-GPU batch
(``train_dataloader.batch_size``) and reaches the plugin run's effective batch with
mmengine's ``accumulative_counts``; everything else (loader, precision, cudnn) is the
stock config's.

Examples::

    # 1 and 2 GPUs of one machine
    python tools/benchmark_scaling.py configs/pv_rcnn/pv_rcnn_synthetic_kitti.py \
        --nproc 1,2 --iters 30 --warmup 5 --out work_dirs/bench_pv_rcnn
    # CPU (gloo), for testing the tool itself
    python tools/benchmark_scaling.py configs/pointpillars/pointpillars_synthetic_kitti.py \
        --devices cpu --nproc 1,2 --iters 3 --warmup 1 --out /tmp/bench
    # multi-node (run the same command on every node; node 0 writes the results):
    python tools/benchmark_scaling.py CONFIG --nproc 8 --nnodes 2 --node-rank $NODE_RANK \
        --master-addr $MASTER_ADDR --master-port 29500 --out work_dirs/bench_2x8
"""
import argparse
import copy
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as torch_dist
from mmengine.hooks import Hook

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULT_VERSION = 1


# ------------------------------------------------------------------------ worker side
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
    """

    priority = 'LOWEST'  # after_train_iter last: logging/checkpointing count as step time

    def __init__(self, warmup_steps: int, steps: int, comm: str, result_path: str,
                 warmup_iters: int = 0,
                 start_barrier: Optional[Dict[str, Any]] = None) -> None:
        self.warmup_steps = warmup_steps
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
    per-iteration summary (:func:`mmdet3d_scaling.engine.profiling.summarize_profile`:
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
        from mmdet3d_scaling.engine.host_reads import SyncSiteRecorder
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
        from mmdet3d_scaling.engine.profiling import summarize_profile
        self.timer.profile = summarize_profile(self._prof, iters, wall)
        if sites is not None:
            self.timer.profile['sync_sites'] = sites
        if self.trace_dir:
            from mmengine.dist import get_rank
            os.makedirs(self.trace_dir, exist_ok=True)
            self._prof.export_chrome_trace(
                os.path.join(self.trace_dir, f'trace_rank{get_rank()}.json'))
        self._prof = None


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
    return cfg


def run_worker(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    sys.path.insert(0, ROOT)
    from mmengine.config import Config, DictAction  # noqa: F401
    from mmengine.runner import Runner
    if spec['plugin']:
        import mmdet3d_scaling  # noqa: F401  (wraps Runner.from_cfg with prepare_config)
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
                               start_barrier=spec.get('start_barrier'))
    runner.register_hook(timer, priority='LOWEST')
    runner.register_hook(PeakMemoryHook(timer), priority='VERY_HIGH')
    if spec.get('profile'):
        runner.register_hook(ProfileHook(timer, spec.get('trace_dir')), priority='VERY_LOW')
    runner.train()
    from mmdet3d_scaling.engine.launcher import shutdown_distributed
    shutdown_distributed(runner)  # drops the DDP wrapper before the process group


# ------------------------------------------------------------------ orchestrator side
def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(('', 0))
        return s.getsockname()[1]


def _prepare_run(spec: Dict[str, Any], nproc: int,
                 args: argparse.Namespace) -> Tuple[List[str], Dict[str, str]]:
    """Write the run's spec (dropping a stale result); the worker command and its env."""
    os.makedirs(spec['work_dir'], exist_ok=True)
    spec_path = os.path.join(spec['work_dir'], 'spec.json')
    with open(spec_path, 'w') as f:
        json.dump(spec, f, indent=1)
    if os.path.exists(spec['result']):
        os.remove(spec['result'])  # a stale result must not pass for this run's
    env = dict(os.environ)
    env['PYTHONPATH'] = ROOT + (os.pathsep + env['PYTHONPATH'] if env.get('PYTHONPATH')
                                else '')
    if args.devices == 'cpu':
        env['CUDA_VISIBLE_DEVICES'] = ''
        env.setdefault('OMP_NUM_THREADS', str(max(1, (os.cpu_count() or 1) // nproc)))
    return [sys.executable, os.path.abspath(__file__), '--worker', spec_path], env


def _launch(spec: Dict[str, Any], nproc: int, args: argparse.Namespace) -> Dict[str, Any]:
    """One training run in fresh processes; returns rank 0's result JSON."""
    me, env = _prepare_run(spec, nproc, args)
    if nproc == 1 and args.nnodes == 1 and not spec.get('ddp_one'):
        cmd = me
    else:
        port = args.master_port or _free_port()
        cmd = [sys.executable, '-m', 'torch.distributed.run', f'--nnodes={args.nnodes}',
               f'--node_rank={args.node_rank}', f'--master_addr={args.master_addr}',
               f'--master_port={port}', f'--nproc_per_node={nproc}'] + me[1:]
    log_path = os.path.join(spec['work_dir'], 'run.log')
    print(f'[benchmark_scaling] {spec["label"]}: {nproc} process(es) x {args.nnodes} '
          f'node(s), comm {spec["comm"]} ... (log: {log_path})', flush=True)
    with open(log_path, 'w') as log:
        proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                              timeout=args.timeout)
    result = _read_result(spec['result'], nproc * args.nnodes)
    if proc.returncode != 0:
        with open(log_path) as f:
            tail = f.read()[-4000:]
        if result is None:
            raise RuntimeError(f'benchmark run failed (exit {proc.returncode}): '
                               f'{" ".join(cmd)}\n--- last lines of {log_path} ---\n'
                               f'{tail}')
        # Training finished and every rank reported; a process died while exiting.
        print(f'[benchmark_scaling] WARNING: {spec["label"]} ({nproc} process(es)) '
              f'exited with code {proc.returncode} after all ranks had written their '
              f'figures; they are used, the exit is recorded as exit_code (log: '
              f'{log_path}).', flush=True)
        result['exit_code'] = proc.returncode
    if args.node_rank != 0:
        return {}
    if result is None:
        raise RuntimeError(f'benchmark run wrote no complete result: {spec["result"]} '
                           f'(log: {log_path})')
    return result


def _visible_gpus(n: int) -> List[str]:
    """CUDA_VISIBLE_DEVICES values for n single-GPU processes (honours an existing list)."""
    visible = os.environ.get('CUDA_VISIBLE_DEVICES')
    ids = [v for v in visible.split(',') if v.strip()] if visible else \
        [str(i) for i in range(n)]
    if len(ids) < n:
        raise SystemExit(f'benchmark_scaling: --independent with {n} runs needs {n} GPUs, '
                         f'CUDA_VISIBLE_DEVICES={visible!r} lists {len(ids)}.')
    return ids[:n]


def _launch_independent(base: Dict[str, Any], label: str, n: int,
                        args: argparse.Namespace) -> List[Dict[str, Any]]:
    """n single-process runs at once, one GPU each, no process group; their results."""
    gpus = _visible_gpus(n) if args.devices == 'cuda' else [''] * n
    procs = []
    barrier = os.path.join(args.out, f'{label}_n{n}_independent', 'start_barrier')
    shutil.rmtree(barrier, ignore_errors=True)  # a stale run's files must not count
    for i, gpu in enumerate(gpus):
        work = os.path.join(args.out, f'{label}_n{n}_independent', f'run{i}')
        spec = dict(base, label=label, comm='on', work_dir=work,
                    result=os.path.join(work, 'result.json'),
                    start_barrier=dict(directory=barrier, count=n, timeout_s=args.timeout))
        cmd, env = _prepare_run(spec, n, args)
        if args.devices == 'cuda':
            env['CUDA_VISIBLE_DEVICES'] = gpu
            # the threads torchrun gives each of N ranks: only the process group differs
            env.setdefault('OMP_NUM_THREADS', '1')
        for key in ('WORLD_SIZE', 'RANK', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT'):
            env.pop(key, None)
        log = open(os.path.join(work, 'run.log'), 'w')
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT),
                      log, spec, work))
    print(f'[benchmark_scaling] {label}: {n} independent single-GPU runs at once ...',
          flush=True)
    try:
        _wait_together([p for p, *_ in procs], args.timeout)
    finally:
        for _, log, _, _ in procs:
            log.close()
    raws = [_read_result(spec['result'], 1) for _, _, spec, _ in procs]
    # report the run that failed by itself, not one stopped because of it
    failed = sorted((proc.returncode == -signal.SIGTERM, i)
                    for i, (proc, *_) in enumerate(procs) if raws[i] is None)
    if failed:
        proc, _, _, work = procs[failed[0][1]]
        with open(os.path.join(work, 'run.log')) as f:
            tail = f.read()[-4000:]
        raise RuntimeError(f'independent run failed (exit {proc.returncode}), log '
                           f'{work}/run.log:\n{tail}')
    return raws


def _wait_together(procs: List[subprocess.Popen], timeout_s: float) -> None:
    """Wait for runs that meet at a start barrier: when one fails, stop the others
    (they would wait at the barrier until its time limit); past ``timeout_s`` stop all."""
    deadline = time.monotonic() + timeout_s
    while any(p.poll() is None for p in procs):
        failed = any(p.returncode not in (None, 0) for p in procs)
        if failed or time.monotonic() > deadline:
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            return
        time.sleep(0.5)


def summarise_independent(raws: List[Dict[str, Any]], ddp_rate: float,
                          base_rate: float) -> Dict[str, Any]:
    """The ceiling of N independent runs against the N-GPU run and the 1-GPU rate."""
    rates = [r['ranks'][0]['samples'] / r['ranks'][0]['seconds'] for r in raws]
    total = sum(rates)
    return dict(runs=len(rates), samples_per_s=total, samples_per_s_per_run=rates,
                overlap=window_overlap([r['ranks'][0].get('window') for r in raws]),
                host=[r['ranks'][0].get('host') for r in raws],
                ceiling_efficiency=total / (len(rates) * base_rate),
                ddp_cost=1.0 - ddp_rate / total)


def window_overlap(windows: List[Optional[List[float]]]) -> Optional[float]:
    """Share of the shortest measured window during which all runs were measuring
    (1.0: fully at the same time; 0.0: one after another)."""
    if not windows or any(not w or len(w) != 2 for w in windows):
        return None
    shortest = min(w[1] - w[0] for w in windows)
    if shortest <= 0:
        return None
    common = min(w[1] for w in windows) - max(w[0] for w in windows)
    return max(0.0, common) / shortest


def _read_result(path: str, world_size: int) -> Optional[Dict[str, Any]]:
    """Rank 0's result JSON if it exists and holds every rank's figures."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        result = json.load(f)
    return result if len(result.get('ranks', [])) == world_size else None


def summarise(raw: Dict[str, Any], epoch_samples: Optional[int]) -> Dict[str, Any]:
    """Figures of one run from the per-rank measurements."""
    ranks = raw['ranks']
    seconds = max(r['seconds'] for r in ranks)  # the slowest rank sets the pace
    iters = ranks[0]['iters']
    samples = sum(r['samples'] for r in ranks)
    steps = iters / raw['accumulation']
    rate = samples / seconds
    per_rank_rate = [r['samples'] / r['seconds'] for r in ranks]
    waits = [r['data_wait_s'] / r['seconds'] for r in ranks]
    mems = [r['peak_mem_mb'] for r in ranks if r['peak_mem_mb'] is not None]
    n_epoch = epoch_samples or raw['dataset_len']
    steps_s = ranks[0].get('step_seconds') or []  # ranks in lockstep: rank 0's will do
    iters_s = ranks[0].get('iter_seconds') or []
    return dict(
        world_size=raw['world_size'],
        per_gpu_batch=raw['per_gpu_batch'],
        accumulation=raw['accumulation'],
        total_batch=raw['world_size'] * raw['per_gpu_batch'] * raw['accumulation'],
        step_s=seconds / steps,
        iter_s=seconds / iters,
        samples_per_s=rate,
        epoch_samples=n_epoch,
        epoch_s=n_epoch / rate,
        data_wait_share=max(waits),
        peak_mem_mb=max(mems) if mems else None,
        spread=dict(samples_per_s_min=min(per_rank_rate),
                    samples_per_s_max=max(per_rank_rate),
                    data_wait_share_min=min(waits), data_wait_share_max=max(waits),
                    peak_mem_mb_min=min(mems) if mems else None,
                    peak_mem_mb_max=max(mems) if mems else None),
        step_s_quantiles=_quantiles(steps_s),
        iter_s_quantiles=_quantiles(iters_s),
        lockstep_bound=(lockstep_bound(iters_s) if raw['world_size'] == 1 else None),
        host=[r.get('host') for r in ranks],
        gpu_monitor=raw.get('gpu_monitor', {}),
        device=raw['device'],
        exit_code=raw.get('exit_code', 0),  # non-zero: died while exiting (warned)
    )


def _quantiles(values: List[float]) -> Optional[Dict[str, float]]:
    """Median, 90th percentile and maximum of step times (jitter: p90 / median)."""
    if not values:
        return None
    ordered = sorted(values)
    last = len(ordered) - 1
    return dict(p50=ordered[round(0.5 * last)], p90=ordered[round(0.9 * last)],
                max=ordered[-1])


def expected_max(values: List[float], draws: int) -> float:
    """Expected maximum of ``draws`` independent picks from ``values`` (with
    replacement): the sorted value i of m is the maximum with probability
    (i/m)^draws - ((i-1)/m)^draws."""
    ordered = sorted(values)
    m = len(ordered)
    return sum(v * ((i / m) ** draws - ((i - 1) / m) ** draws)
               for i, v in enumerate(ordered, start=1))


LOCKSTEP_WORLDS = (2, 4, 8)
LOCKSTEP_MIN_ITERS = 8  # fewer micro-batch times say too little about their spread


def lockstep_bound(iter_seconds: List[float]) -> Optional[Dict[str, float]]:
    """Efficiency N ranks would reach if each drew its micro-batch time from one
    process's measured times and all waited for the slowest at every micro-batch
    (DDP's gradient all-reduce): mean / E[max of N]. Only the spread of micro-batch
    times enters; communication and sharing the machine come on top."""
    if len(iter_seconds) < LOCKSTEP_MIN_ITERS:
        return None
    mean = sum(iter_seconds) / len(iter_seconds)
    return {str(n): mean / expected_max(iter_seconds, n) for n in LOCKSTEP_WORLDS}


def add_scaling(rows: List[Dict[str, Any]]) -> None:
    """Speedup and efficiency against the smallest process count measured."""
    base = min(rows, key=lambda r: r['world_size'])
    for row in rows:
        n = row['world_size'] / base['world_size']
        row['speedup'] = row['samples_per_s'] / base['samples_per_s']
        row['efficiency'] = row['speedup'] / n


def _fmt(value: Optional[float], pattern: str) -> str:
    return '-' if value is None or (isinstance(value, float) and math.isnan(value)) \
        else pattern.format(value)


def _table_head(head: str) -> List[str]:
    """A markdown table's header line and separator."""
    return [head, '|' + '---|' * (head.count('|') - 1)]


def _step_quantiles(q: Optional[Dict[str, float]]) -> str:
    return '-' if not q else f"{q['p50']:.3f} / {q['p90']:.3f} s"


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f'{seconds / 3600:.2f} h'
    if seconds >= 60:
        return f'{seconds / 60:.1f} min'
    return f'{seconds:.1f} s'


def markdown_table(result: Dict[str, Any]) -> str:
    head = ('| config | GPUs | batch (GPU x N x acc) | time/step | step p50 / p90 '
            '| time/epoch | samples/s '
            '| speedup | efficiency | data wait | memory/GPU (MiB) | samples/s per rank '
            '(min-max) | comm/step (exposed) | measured on |')
    lines = _table_head(head)
    for row in result['rows']:
        spread = row['spread']
        lines.append(
            f"| {row['label']} | {row['world_size']} | {row['per_gpu_batch']} x "
            f"{row['world_size']} x {row['accumulation']} = {row['total_batch']} "
            f"| {row['step_s']:.3f} s | {_step_quantiles(row.get('step_s_quantiles'))} "
            f"| {_duration(row['epoch_s'])} "
            f"| {row['samples_per_s']:.2f} | {_fmt(row.get('speedup'), '{:.2f}x')} "
            f"| {_fmt(row.get('efficiency'), '{:.2f}')} | {row['data_wait_share']:.1%} "
            f"| {_fmt(row['peak_mem_mb'], '{:.0f}')} "
            f"| {spread['samples_per_s_min']:.2f}-{spread['samples_per_s_max']:.2f} "
            f"| {_fmt(row.get('comm_step_s'), '{:.3f} s')} | {row['device']} |")
    lines.append('')
    lines.append(f"time/epoch: {result['rows'][0]['epoch_samples']} samples an epoch; "
                 'time/step: one optimizer step of the effective batch (mean; p50 / p90: '
                 'median and 90th percentile of single steps, rank 0); comm: step time '
                 'minus the step time of a run with DDP all-reduce replaced by a no-op.')
    bounds = [row for row in result['rows'] if row.get('lockstep_bound')]
    if bounds:
        lines.append('')
        lines.append(
            'Lockstep bound (efficiency if N ranks drew their micro-batch times from the '
            '1-GPU run\'s and waited for the slowest at every micro-batch): '
            + '; '.join(f"{row['label']}: " + ', '.join(
                f'N={n} {eff:.3f}' for n, eff in row['lockstep_bound'].items())
                + f" (micro-batch p50 / p90 {_step_quantiles(row.get('iter_s_quantiles'))})"
                for row in bounds) + '.')
    hosts = [f"{row['world_size']} GPU(s): " + _hosts_text(row.get('host'))
             for row in result['rows'] if any(row.get('host') or [])]
    if hosts:
        lines.append('')
        lines.append('Main thread per rank (CPUs it may use at the start -> at the end / '
                     "torch's intra-op threads / the process's threads): "
                     + '; '.join(hosts) + '.')
    return '\n'.join(lines)


def _hosts_text(hosts: Optional[List[Optional[Dict[str, Any]]]]) -> str:
    """Per rank: CPUs its main thread may use (start -> end) / intra-op threads / threads."""
    return ', '.join(f"{h['cpus_allowed_at_start']}->{h['cpus_allowed']} CPUs / "
                     f"{h['intra_op_threads']} intra-op / {h['process_threads']} threads"
                     for h in hosts or [] if h) or '-'


def plot(result: Dict[str, Any], path: str) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    groups: Dict[str, List[Dict[str, Any]]] = {}
    for row in result['rows']:
        groups.setdefault(row['label'], []).append(row)
    for label, rows in groups.items():
        rows = sorted(rows, key=lambda r: r['world_size'])
        ns = [r['world_size'] for r in rows]
        ax1.plot(ns, [r['samples_per_s'] for r in rows], 'o-', label=label)
        if len(rows) > 1:
            ideal = [rows[0]['samples_per_s'] * n / ns[0] for n in ns]
            ax1.plot(ns, ideal, ':', color='grey', label=f'{label} (linear)')
        ax2.plot(ns, [r.get('efficiency', math.nan) for r in rows], 'o-', label=label)
    ax1.set_xlabel('GPUs (processes)')
    ax1.set_ylabel('samples/s')
    ax1.legend(fontsize=7)
    ax2.axhline(1.0, color='grey', linestyle=':')
    ax2.set_ylim(0, 1.1)
    ax2.set_xlabel('GPUs (processes)')
    ax2.set_ylabel('scaling efficiency')
    fig.suptitle(os.path.basename(result['config']))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _parse_nproc(text: str) -> List[int]:
    try:
        values = [int(v) for v in text.split(',') if v.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(
            f'--nproc must be a comma-separated list of positive ints (e.g. 1,2,4), '
            f'got {text!r}')
    return sorted(set(values))


def _check_devices(args: argparse.Namespace) -> None:
    if args.devices != 'cuda':
        return
    import torch
    have = torch.cuda.device_count()
    if max(args.nproc) > have:
        raise SystemExit(f'benchmark_scaling: --nproc {max(args.nproc)} needs as many '
                         f'GPUs, but {have} are visible; lower --nproc or use '
                         '--devices cpu (gloo) for a functional test.')


def _measure(base: Dict[str, Any], label: str, n: int, args: argparse.Namespace,
             tag: str = '') -> Optional[Dict[str, Any]]:
    """One timed run at n processes (plus its comm-off twin): a table row, or None."""
    modes = ['on'] + (['off'] if args.comm_run and n * args.nnodes > 1 else [])
    measured: Dict[str, Dict[str, Any]] = {}
    for comm in modes:
        work = os.path.join(args.out, f'{label}_n{n}_comm-{comm}{tag}')
        spec = dict(base, label=label, comm=comm, work_dir=work,
                    result=os.path.join(work, 'result.json'))
        raw = _launch(spec, n, args)
        if raw:
            measured[comm] = summarise(raw, args.epoch_samples)
    if not measured:
        return None
    row = dict(measured['on'], label=label, config=args.config)
    if 'off' in measured:
        row['comm_step_s'] = max(0.0, row['step_s'] - measured['off']['step_s'])
        row['no_comm_step_s'] = measured['off']['step_s']
        row['comm_share'] = row['comm_step_s'] / row['step_s']
    elif row['world_size'] == 1:
        row['comm_step_s'] = 0.0
    return row


def round_order(nproc: List[int], round_index: int) -> List[int]:
    """Process counts of one round: ascending, then descending (1,2 / 2,1 / 1,2 ...), so
    that a drift of the machine's speed during the rounds favours no count."""
    return list(nproc) if round_index % 2 == 0 else list(reversed(nproc))


def _lower_median(values: List[Any], key: Callable[[Any], float] = lambda v: v) -> Any:
    """The median of ``values`` by ``key``; of an even count, the lower of the two."""
    ordered = sorted(values, key=key)
    return ordered[(len(ordered) - 1) // 2]


def median_row(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The run of median samples/s (the lower one of an even count), with every run's
    rate and comm time under ``repeats``."""
    row = dict(_lower_median(runs, key=lambda r: r['samples_per_s']))
    row['repeats'] = dict(samples_per_s=[r['samples_per_s'] for r in runs],
                          step_s=[r['step_s'] for r in runs])
    comm = [r['comm_step_s'] for r in runs if r.get('comm_step_s') is not None]
    if len(runs) > 1 and comm:
        row['comm_step_s'] = _lower_median(comm)
        row['comm_share'] = row['comm_step_s'] / row['step_s']
    return row


def add_round_efficiency(rows: List[Dict[str, Any]]) -> None:
    """Efficiency of each round (its N-GPU run against its own 1-GPU run) and the median
    of those, on rows measured more than once."""
    base = min(rows, key=lambda r: r['world_size'])
    base_rates = base.get('repeats', {}).get('samples_per_s', [])
    if len(base_rates) < 2:
        return
    for row in rows:
        n = row['world_size'] / base['world_size']
        per_round = [rate / (n * one) for rate, one in
                     zip(row['repeats']['samples_per_s'], base_rates)]
        row['repeats']['efficiency'] = per_round
        row['repeats']['efficiency_median'] = _lower_median(per_round)


def run_benchmark(args: argparse.Namespace) -> Dict[str, Any]:
    _check_devices(args)
    os.makedirs(args.out, exist_ok=True)
    label = os.path.splitext(os.path.basename(args.config))[0]
    base = dict(config=os.path.abspath(args.config), cfg_options=args.cfg_options or {},
                warmup=args.warmup, warmup_iters=args.warmup_iters, iters=args.iters,
                plugin=True,
                gpu_monitor=not args.no_gpu_monitor)
    runs: Dict[int, List[Dict[str, Any]]] = {}
    for r in range(args.repeats):
        tag = f'_r{r + 1}' if args.repeats > 1 else ''
        for n in round_order(args.nproc, r):
            row = _measure(base, label, n, args, tag)
            if row is not None:
                runs.setdefault(n, []).append(row)
    rows: List[Dict[str, Any]] = []
    for n in args.nproc:  # profile / independent runs once, after the timed rounds
        if n not in runs:
            continue
        row = median_row(runs[n])
        if args.profile_steps:
            row['profile'] = _profile_run(base, label, n, args)
        if args.independent and n > 1:
            row['independent_raw'] = _launch_independent(base, label, n, args)
        if args.ddp_one and n == 1:
            one = _ddp_one_run(base, label, args)
            row['ddp_one'] = dict(one, cost=1.0 - one['samples_per_s'] / row['samples_per_s'])
        rows.append(row)
    if args.node_rank != 0:
        return {}
    add_scaling(rows)
    add_round_efficiency(rows)
    for row in rows:
        raws = row.pop('independent_raw', None)
        if raws:  # parse_args made sure a 1-process row exists
            one = next(r for r in rows if r['world_size'] == 1)
            row['independent'] = summarise_independent(raws, row['samples_per_s'],
                                                        one['samples_per_s'])
    if args.compare_stock:
        rows += _compare(args, rows)
    result = dict(version=RESULT_VERSION, config=args.config, nproc=args.nproc,
                  nnodes=args.nnodes, devices=args.devices, warmup_steps=args.warmup,
                  warmup_iters=args.warmup_iters, repeats=args.repeats,
                  steps=args.iters, command=' '.join(sys.argv), rows=rows,
                  created=time.strftime('%Y-%m-%d %H:%M:%S'))
    _write_outputs(result, args.out)
    return result


def stock_accumulation(total_batch: int, stock_batch: int, nproc: int) -> int:
    """Accumulation steps that give the stock per-GPU batch the plugin's effective batch."""
    if total_batch % (stock_batch * nproc):
        raise SystemExit(
            f'benchmark_scaling: the plugin run\'s effective batch {total_batch} is not a '
            f'multiple of the stock config\'s per-GPU batch {stock_batch} x {nproc} GPU(s); '
            'pick a --compare-nproc or a plugin total_batch_size that it divides.')
    return total_batch // (stock_batch * nproc)


def _profile_run(base: Dict[str, Any], label: str, n: int,
                 args: argparse.Namespace) -> List[Dict[str, Any]]:
    """A separate run of ``--profile-steps`` steps under torch.profiler (profiling slows
    training, so its time is not used for the table); per-rank summaries."""
    work = os.path.join(args.out, f'{label}_n{n}_profile')
    spec = dict(base, label=label, comm='on', work_dir=work, iters=args.profile_steps,
                result=os.path.join(work, 'result.json'), profile=True,
                trace_dir=os.path.join(work, 'traces') if args.profile_traces else None)
    raw = _launch(spec, n, args)
    return [dict(r['profile'], rank=r['rank']) for r in raw.get('ranks', [])
            if 'profile' in r]


def _ddp_one_run(base: Dict[str, Any], label: str,
                 args: argparse.Namespace) -> Dict[str, Any]:
    """One process through torchrun as a DDP world of one: process group, DDP wrapper
    and SyncBN conversion as in the N-GPU runs, but no second GPU to share the machine
    with or wait for."""
    work = os.path.join(args.out, f'{label}_n1_ddp-one')
    spec = dict(base, label=label, comm='on', work_dir=work, ddp_one=True,
                result=os.path.join(work, 'result.json'))
    return summarise(_launch(spec, 1, args), args.epoch_samples)


def _side_table(result: Dict[str, Any], has: Callable[[Dict[str, Any]], Any], head: str,
                line: Callable[[Dict[str, Any]], str], note: str) -> str:
    """A table of the rows for which ``has(row)`` holds, one ``line(row)`` each, with a
    note under it; '' when no row has it."""
    rows = [r for r in result['rows'] if has(r)]
    if not rows:
        return ''
    return '\n'.join(_table_head(head) + [line(r) for r in rows] + ['', note])


def _floats(values: List[float]) -> str:
    return ', '.join(f'{v:.2f}' for v in values)


def _repeats_line(row: Dict[str, Any]) -> str:
    rep = row['repeats']
    rates, effs = rep['samples_per_s'], rep.get('efficiency')
    return (f"| {row['label']} | {row['world_size']} | {_floats(rates)} "
            f"| {row['samples_per_s']:.2f} ({min(rates):.2f}-{max(rates):.2f}) "
            f"| {_floats(effs) if effs else '-'} "
            f"| {_fmt(rep.get('efficiency_median'), '{:.2f}')} "
            f"| {_fmt(row.get('efficiency'), '{:.2f}')} |")


def repeats_table(result: Dict[str, Any]) -> str:
    """Every round's samples/s and efficiency, when the runs were repeated."""
    return _side_table(
        result, lambda r: len(r.get('repeats', {}).get('samples_per_s', [])) > 1,
        '| config | GPUs | samples/s per round | median (min-max) | efficiency per round '
        '| median of rounds | efficiency of medians |', _repeats_line,
        f"{result.get('repeats', 1)} rounds, process counts in alternating order (1,2 then "
        '2,1 ...); the main table shows the median run of each count; efficiency per '
        "round: that round's N-GPU run against its own 1-GPU run.")


def independent_table(result: Dict[str, Any]) -> str:
    """N-GPU runs against N independent single-GPU runs on the same machine."""
    def line(row: Dict[str, Any]) -> str:
        ind = row['independent']
        return (f"| {row['label']} | {row['world_size']} | {row['samples_per_s']:.2f} "
                f"| {ind['samples_per_s']:.2f} | {_floats(ind['samples_per_s_per_run'])} "
                f"| {_fmt(ind.get('overlap'), '{:.0%}')} "
                f"| {_fmt(row.get('efficiency'), '{:.2f}')} "
                f"| {ind['ceiling_efficiency']:.2f} | {ind['ddp_cost']:.1%} "
                f"| {_hosts_text(ind.get('host'))} |")
    return _side_table(
        result, lambda r: r.get('independent'),
        '| config | GPUs | samples/s (distributed) | samples/s (independent runs, sum) '
        '| per run | windows overlap | efficiency | ceiling efficiency | DDP cost '
        '| main thread per run |', line,
        'independent runs: one single-GPU run per GPU at the same time, no process group, '
        'their measured windows started together (a file barrier after the warm-up); '
        'windows overlap: share of the shortest window all runs were measuring; '
        'ceiling efficiency: their sum / (N x the 1-GPU rate), what sharing the machine '
        'leaves; DDP cost: 1 - distributed / independent sum.')


def ddp_one_table(result: Dict[str, Any]) -> str:
    """The 1-process run against the same process as a DDP world of one."""
    def line(row: Dict[str, Any]) -> str:
        one = row['ddp_one']
        return (f"| {row['label']} | {row['samples_per_s']:.2f} "
                f"| {one['samples_per_s']:.2f} | {one['cost']:.1%} "
                f"| {_hosts_text(one.get('host'))} |")
    return _side_table(
        result, lambda r: r.get('ddp_one'),
        '| config | samples/s (1 process) | samples/s (DDP world of one) '
        '| distributed code path cost | main thread (world of one) |', line,
        'DDP world of one: the 1-GPU run started through torchrun with a process group, '
        'the DDP wrapper and SyncBN as configured; cost: 1 - its samples/s / the plain '
        '1-process samples/s.')


def profile_table(result: Dict[str, Any]) -> str:
    """Per-iteration profile figures of the rows that have them (worst rank)."""
    rows = [r for r in result['rows'] if r.get('profile')]
    if not rows:
        return ''
    head = ('| config | GPUs | wall ms / iter | GPU kernel ms / iter | collective kernels '
            'ms / iter | collective CPU ms / iter | host syncs / iter |')
    lines = _table_head(head)
    for row in rows:
        prof = row['profile']

        def worst(key: str) -> float:
            return max(p[key] for p in prof)
        lines.append(
            f"| {row['label']} | {row['world_size']} | {worst('wall_ms_per_iter'):.1f} "
            f"| {worst('device_kernel_ms_per_iter'):.1f} "
            f"| {worst('comm_kernel_ms_per_iter'):.1f} "
            f"| {worst('comm_cpu_ms_per_iter'):.1f} "
            f"| {worst('host_syncs_per_iter'):.1f} |")
    lines.append('')
    lines.append('Profiled runs (torch.profiler, slower than the timed runs above); worst '
                 'rank per column; iteration = one micro-batch. Top operators per rank: '
                 'scaling.json, rows[].profile.')
    for row in rows:
        sites = (row['profile'][0].get('sync_sites') or [])[:5]
        if sites:
            lines.append('')
            lines.append(f"Host waits and copies by call site, {row['world_size']} GPU(s), "
                         'rank 0 (calls / iteration):')
            lines += [f"- {site['calls_per_iter']:.1f} x `{site['op']}` from "
                      f"`{site['site']}`" for site in sites]
    return '\n'.join(lines)


def _compare(args: argparse.Namespace, rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Stock mmdet3d on ``--compare-nproc`` GPUs: its own per-GPU batch, same total."""
    from mmengine.config import Config
    n = args.compare_nproc
    ref = next((r for r in rows if r['world_size'] == n), None)
    if ref is None:
        raise SystemExit(f'benchmark_scaling: --compare-nproc {n} must be one of --nproc '
                         f'{args.nproc} (the stock run matches that run\'s effective '
                         'batch).')
    path = _resolve_stock(args.compare_stock)
    stock_batch = int(Config.fromfile(path, import_custom_modules=False)
                      .train_dataloader.batch_size)
    label = 'stock:' + os.path.splitext(os.path.basename(args.compare_stock))[0]
    work = os.path.join(args.out, f'stock_n{n}')
    spec = dict(config=path, data_from=os.path.abspath(args.config),
                data_cfg_options=args.cfg_options or {}, cfg_options={},
                warmup=args.warmup, warmup_iters=args.warmup_iters, iters=args.iters,
                plugin=False, label=label, comm='on',
                work_dir=work, result=os.path.join(work, 'result.json'),
                per_gpu_batch=stock_batch,
                accumulation=stock_accumulation(ref['total_batch'], stock_batch, n))
    raw = _launch(spec, n, args)
    row = dict(summarise(raw, args.epoch_samples), label=label, config=args.compare_stock)
    row['speedup'] = row['samples_per_s'] / ref['samples_per_s']  # stock vs plugin
    ref['vs_stock'] = ref['samples_per_s'] / row['samples_per_s']
    row['efficiency'] = None
    return [row]


def _resolve_stock(name: str) -> str:
    """A path, or ``mmdet3d::dir/file.py`` from the mmdet3d package's configs."""
    if name.startswith('mmdet3d::'):
        import mmdet3d
        path = os.path.join(os.path.dirname(mmdet3d.__file__), '.mim', 'configs',
                            name[len('mmdet3d::'):])
    else:
        path = os.path.abspath(name)
    if not os.path.exists(path):
        raise SystemExit(f'benchmark_scaling: stock config {name!r} not found ({path}); '
                         "give a path or 'mmdet3d::<dir>/<file>.py'.")
    return path


def _write_outputs(result: Dict[str, Any], out: str) -> None:
    with open(os.path.join(out, 'scaling.json'), 'w') as f:
        json.dump(result, f, indent=1)
    table = markdown_table(result)
    for extra in (repeats_table(result), profile_table(result),
                  independent_table(result), ddp_one_table(result)):
        if extra:
            table += '\n\n' + extra
    with open(os.path.join(out, 'scaling.md'), 'w') as f:
        f.write(f"Command: `{result['command']}`\n\n{table}\n")
    plot(result, os.path.join(out, 'scaling.png'))
    print(table, flush=True)
    print(f'[benchmark_scaling] wrote {out}/scaling.json, scaling.md, scaling.png')


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    from mmengine.config import DictAction
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('config', help='config file (plugin config with a scaling key)')
    p.add_argument('--nproc', type=_parse_nproc, default=[1, 2],
                   help='process (GPU) counts per node, comma-separated (default 1,2)')
    p.add_argument('--devices', choices=('cuda', 'cpu'), default='cuda',
                   help='cuda: one GPU a process (NCCL); cpu: gloo, for testing the tool')
    p.add_argument('--iters', type=int, default=30, help='measured optimizer steps')
    p.add_argument('--warmup', type=int, default=5,
                   help='optimizer steps trained before the measurement starts')
    p.add_argument('--warmup-iters', type=int, default=0,
                   help='and at least this many loop iterations (micro-batches) a process: '
                        'runs whose accumulation differs then warm up alike (default 0)')
    p.add_argument('--out', default='work_dirs/benchmark_scaling', help='output folder')
    p.add_argument('--no-comm-run', dest='comm_run', action='store_false',
                   help='skip the second run per N with DDP communication disabled')
    p.add_argument('--repeats', type=int, default=1,
                   help='measure every process count this many times, in rounds of '
                        'alternating order; the table shows the median run and a second '
                        'table every round (default 1)')
    p.add_argument('--independent', action='store_true',
                   help='for each N > 1, also N single-GPU runs at once without a process '
                        'group: the no-communication ceiling on this machine')
    p.add_argument('--ddp-one', action='store_true',
                   help='also run the 1-process case as a DDP world of one (torchrun, '
                        'process group, DDP wrapper, SyncBN): the distributed code path\'s '
                        'cost without a second GPU')
    p.add_argument('--no-gpu-monitor', action='store_true',
                   help='do not add GPUMonitorHook (it all-gathers a few floats a report)')
    p.add_argument('--epoch-samples', type=int, default=None,
                   help='samples an epoch for time/epoch (default: the train dataset '
                        'length; 3712 x 2 for KITTI train with RepeatDataset x2)')
    p.add_argument('--profile-steps', type=int, default=0,
                   help='also run this many optimizer steps per GPU count under '
                   'torch.profiler: host syncs, collective time, top operators (0: off)')
    p.add_argument('--profile-traces', action='store_true',
                   help='with --profile-steps: write a Chrome trace per rank')
    p.add_argument('--compare-stock', default=None,
                   help="stock mmdet3d config ('mmdet3d::pv_rcnn/...py' or a path) run "
                        'without the plugin on the same data and effective batch')
    p.add_argument('--compare-nproc', type=int, default=1,
                   help='GPU count of the stock comparison run (default 1)')
    p.add_argument('--cfg-options', nargs='+', action=DictAction,
                   help='override settings of the plugin config (key=value)')
    p.add_argument('--nnodes', type=int, default=1, help='nodes (multi-node form)')
    p.add_argument('--node-rank', type=int, default=0)
    p.add_argument('--master-addr', default='127.0.0.1')
    p.add_argument('--master-port', type=int, default=None)
    p.add_argument('--timeout', type=int, default=3600, help='seconds a run may take')
    args = p.parse_args(argv)
    for name, least in (('iters', 1), ('warmup', 0), ('warmup_iters', 0),
                        ('profile_steps', 0), ('repeats', 1)):
        if getattr(args, name) < least:
            p.error(f'--{name.replace("_", "-")} must be >= {least}, '
                    f'got {getattr(args, name)}')
    if args.independent and (args.nnodes > 1 or 1 not in args.nproc):
        p.error('--independent compares N single-GPU runs of one machine with its 1-GPU '
                f'run: it needs --nnodes 1 (got {args.nnodes}) and 1 in --nproc '
                f'(got {",".join(map(str, args.nproc))})')
    if args.ddp_one and (args.nnodes > 1 or 1 not in args.nproc):
        p.error('--ddp-one runs the 1-process case a second time as a DDP world of one: '
                f'it needs --nnodes 1 (got {args.nnodes}) and 1 in --nproc '
                f'(got {",".join(map(str, args.nproc))})')
    if args.nnodes > 1 and args.master_port is None:
        p.error('--nnodes > 1 needs --master-port (the same on every node)')
    return args


def main(argv: Optional[List[str]] = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ['--worker']:
        run_worker(argv[1])
        return
    run_benchmark(parse_args(argv))


if __name__ == '__main__':
    main()
