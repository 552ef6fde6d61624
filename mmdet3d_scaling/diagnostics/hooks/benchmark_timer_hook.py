"""BenchmarkTimerHook: times the measured window of a scaling benchmark run.

Loaded by the benchmark's worker in plugin and stock runs alike: imports only the
standard library, torch, mmengine and the plugin's modules that do the same
(:mod:`mmdet3d_scaling.engine.optim_state`, :mod:`mmdet3d_scaling.engine.train_length`).
"""
import json
import math
import os
import platform
import time
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as torch_dist
from mmengine.hooks import Hook

from ...engine.optim_state import accumulation
from ...engine.train_length import train_for


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
    hook serves plugin and stock runs. In ``before_train`` it sets the run's length to
    (warm-up + measured) optimizer steps x the optim wrapper's accumulation.

    Priority ``LOWEST``: its ``after_train_iter`` runs last, so logging and
    checkpointing count as step time.

    Args:
        warmup_steps (int): optimizer steps excluded from the measurement.
        steps (int): optimizer steps measured.
        comm (str): 'on' (normal DDP), or 'off' (DDP all-reduce replaced by a no-op
            hook).
        result_path (str): JSON file rank 0 writes the gathered figures to.
        warmup_iters (int): at least this many loop iterations (micro-batches) of this
            process are excluded too, so that runs with different accumulation warm up
            alike (caching allocator, cuDNN autotuning, clocks). Defaults to 0.
        start_barrier (dict, optional): ``{'directory': ..., 'count': N, 'timeout_s':
            ...}`` (seconds): wait before the measured window until N processes without
            a process group (the ``--independent`` runs) have reached theirs, so the
            windows overlap. Defaults to None (no barrier).
        intra_op_threads (int, optional): torch's intra-op threads, set at the start of
            training so that plugin and stock runs use the same number whatever their
            construction did. Defaults to None (the process's setting).
    """

    priority = 'LOWEST'

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
        self.measure_from = 0  # first measured loop iteration
        self.cuda = False  # whether the model trains on a CUDA device
        self._t_start: Optional[float] = None
        self._t_end: Optional[float] = None
        self._window: List[float] = []  # wall clock (time.time) at start and end
        self._prev_end: Optional[float] = None
        self._wait_s = 0.0
        self._step_ends: List[float] = []  # host clock at each measured step's end
        self._iter_ends: List[float] = []  # ... and at each measured micro-batch's end
        self._samples = 0
        self._iters = 0
        self.peak_mb = 0.0  # raised by PeakMemoryHook (the logger resets CUDA's counter)
        self.profile: Optional[Dict[str, Any]] = None  # set by ProfileHook
        self._host_start: Dict[str, Any] = {}

    def before_train(self, runner) -> None:
        """Fix the run's length from the optim wrapper's accumulation, set the threads,
        and with ``comm='off'`` replace DDP's all-reduce by a no-op."""
        from mmengine.model import is_model_wrapper
        if self.intra_op_threads:
            torch.set_num_threads(self.intra_op_threads)
        self._host_start = host_facts()
        self.accumulation = accumulation(runner.optim_wrapper)
        self.warmup_steps = max(self.warmup_steps,
                                -(-self.warmup_iters // self.accumulation))
        total_iters = (self.warmup_steps + self.steps) * self.accumulation
        train_for(runner, total_iters)  # micro-batches
        self.measure_from = self.warmup_steps * self.accumulation
        param = next(runner.model.parameters())
        self.cuda = param.device.type == 'cuda'
        if self.comm == 'off':
            model = runner.model
            if not (is_model_wrapper(model) and hasattr(model, 'register_comm_hook')):
                return  # single process: nothing is communicated anyway
            model.register_comm_hook(state=None, hook=_noop_allreduce)
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(param.device)

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def before_train_iter(self, runner, batch_idx: int, data_batch: Any = None) -> None:
        """Start the measured window at its first iteration (after the start barrier);
        inside it, count the time since the previous iteration as data wait."""
        it = runner.iter
        if it == self.measure_from:
            if self.start_barrier:
                wait_for_peers(**self.start_barrier)
            self._t_start = self._now()
            self._window = [time.time()]
            self._step_ends = [self._t_start]
            self._iter_ends = [self._t_start]
            self._prev_end = None
            if self.cuda:
                torch.cuda.reset_peak_memory_stats()
        elif it > self.measure_from and self._prev_end is not None:
            self._wait_s += time.perf_counter() - self._prev_end

    def after_train_iter(self, runner, batch_idx: int, data_batch: Any = None,
                         outputs: Any = None) -> None:
        """Record a measured micro-batch (its samples and end time) and, at a window's
        end, the optimizer step's end; the run's last iteration closes the window."""
        it = runner.iter  # not yet incremented
        if it < self.measure_from:
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
        """Gather every rank's figures; rank 0 writes them to ``result_path``."""
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
                         if self.cuda else None),
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
            device=_device_name(self.cuda),
            ranks=ranks,
            gpu_monitor=_gpu_monitor_log(runner.log_dir),
        )
        with open(self.result_path, 'w') as f:
            json.dump(result, f, indent=1)


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
