"""GPUMonitorHook: per-interval GPU memory, NVML device stats, throughput and data wait.

Everything is written to ``runner.message_hub`` under ``train/gpu_*`` (and ``train/amp/*``
for the loss scaler of mixed precision) so that the LoggerHook puts it into the text
log, the JSON scalars and TensorBoard. The per-iteration work is a few
``time.perf_counter()`` calls, a ``len()`` and integer counters; CUDA counters, the loss
scale, NVML and the cross-rank gather are touched only at report time (once per interval).
"""
import logging
import math
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as torch_dist
from mmengine.dist import get_comm_device, get_world_size, is_distributed
from mmengine.hooks import Hook, LoggerHook
from mmengine.logging import print_log
from mmengine.optim import OptimWrapper, OptimWrapperDict

from mmdet3d.registry import HOOKS

from ..registry import register
from .optimizer_step_param_scheduler_hook import optimizer_stepped

DATA_BATCH = Optional[Union[dict, tuple, list]]
MB = 1024 * 1024
PREFIX = 'train/gpu_'
AMP_PREFIX = 'train/amp/'
# Keys compared across ranks (min / max), in the order of the gathered vector.
ACROSS_RANK_KEYS = ('samples_per_s', 'data_wait_share', 'mem_peak_mb', 'util_pct')


def batch_size_of(data_batch: Any) -> Optional[int]:
    """Number of samples in a collated batch, from host-side metadata only (no sync).

    mmdet3d batches are ``dict(inputs=..., data_samples=[...])``; a tensor gives its
    first dimension, a list its length, a dict its first value that has a size.
    """
    if isinstance(data_batch, dict):
        samples = data_batch.get('data_samples')
        if isinstance(samples, (list, tuple)):
            return len(samples)
        if 'inputs' in data_batch:
            return batch_size_of(data_batch['inputs'])
        for value in data_batch.values():
            size = batch_size_of(value)
            if size is not None:
                return size
        return None
    if isinstance(data_batch, torch.Tensor):
        return int(data_batch.shape[0]) if data_batch.dim() > 0 else None
    if isinstance(data_batch, (list, tuple)):
        return len(data_batch)
    return None


class _NvmlDevice:
    """NVML queries for one CUDA device; a field that the device refuses is dropped."""

    def __init__(self, pynvml: Any, device_index: int) -> None:
        self._nvml = pynvml
        pynvml.nvmlInit()
        self.handle = self._handle_for(device_index)
        self._last_sample_us = 0
        self.dropped: List[str] = []
        try:  # skip the samples from before training (start-up, other jobs)
            self._utilisation()
        except pynvml.NVMLError:
            pass

    def _handle_for(self, device_index: int) -> Any:
        # torch's index counts only CUDA_VISIBLE_DEVICES; NVML counts every GPU. The
        # UUID names the same card in both.
        uuid = getattr(torch.cuda.get_device_properties(device_index), 'uuid', None)
        if uuid is not None:
            try:
                return self._nvml.nvmlDeviceGetHandleByUUID(f'GPU-{uuid}')
            except self._nvml.NVMLError:
                pass
        return self._nvml.nvmlDeviceGetHandleByIndex(device_index)

    def _utilisation(self) -> float:
        """Mean GPU utilisation (%) of the driver's samples since the last call.

        Falls back to the instantaneous figure when the driver has no new samples.
        """
        nvml = self._nvml
        try:
            value_type, samples = nvml.nvmlDeviceGetSamples(
                self.handle, nvml.NVML_GPU_UTILIZATION_SAMPLES, self._last_sample_us)
        except nvml.NVMLError:
            samples = []
        samples = [s for s in samples if s.timeStamp > self._last_sample_us]
        if not samples:
            return float(nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)
        field = {0: 'dVal', 1: 'uiVal', 2: 'ulVal', 3: 'ullVal', 4: 'sllVal'}.get(
            value_type, 'uiVal')
        self._last_sample_us = max(s.timeStamp for s in samples)
        return sum(float(getattr(s.sampleValue, field)) for s in samples) / len(samples)

    def read(self) -> Dict[str, float]:
        nvml = self._nvml
        queries = {
            'util_pct': self._utilisation,
            'nvml_mem_used_mb': lambda: nvml.nvmlDeviceGetMemoryInfo(self.handle).used / MB,
            'power_w': lambda: nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0,
            'temp_c': lambda: float(
                nvml.nvmlDeviceGetTemperature(self.handle, nvml.NVML_TEMPERATURE_GPU)),
        }
        values = {}
        for key, query in queries.items():
            if key in self.dropped:
                continue
            try:
                values[key] = float(query())
            except nvml.NVMLError as err:
                self.dropped.append(key)
                print_log(f'GPUMonitorHook: NVML cannot report {key} on this device '
                          f'({err}); it is left out from now on.', logger='current')
        return values

    def close(self) -> None:
        self._nvml.nvmlShutdown()


class _SkippedSteps:
    """Optimizer steps that a GradScaler skipped (inf/nan gradients), without a sync.

    GradScaler decides on the host whether to call ``optimizer.step()`` (its own
    ``found_inf`` sync), so a step post-hook on the optimizer sees exactly the steps
    taken; the wrapper's ``should_update()`` after each iteration says which iterations
    asked for one. Skipped = asked - taken; works for dynamic and static loss scales.
    Only :meth:`figures` reads the GPU (the scale, once per report).
    """

    def __init__(self, wrapper: OptimWrapper) -> None:
        self.scaler = wrapper.loss_scaler
        self.asked = 0
        self.taken = 0
        self._reported = 0
        self._asked_reported = 0
        self._handle = wrapper.optimizer.register_step_post_hook(self._on_step)

    @staticmethod
    def scaler_of(wrapper: Any) -> Tuple[Optional[Any], str]:
        """(the wrapper's enabled GradScaler, or None with the reason)."""
        if isinstance(wrapper, OptimWrapperDict) or not isinstance(wrapper, OptimWrapper):
            return None, f'optim_wrapper is a {type(wrapper).__name__}, not one ' \
                         'AmpOptimWrapper'
        scaler = getattr(wrapper, 'loss_scaler', None)
        if scaler is None:
            return None, 'no AmpOptimWrapper (no loss scaling)'
        if not isinstance(scaler, torch.amp.GradScaler) or not scaler.is_enabled():
            return None, ('the AmpOptimWrapper\'s loss scaling is off (bf16, or a CPU '
                          'run), so no step is ever skipped')
        return scaler, ''

    def _on_step(self, optimizer, args, kwargs) -> None:
        self.taken += 1

    def after_iter(self, runner) -> None:
        if optimizer_stepped(runner):
            self.asked += 1

    @property
    def skipped(self) -> int:
        return self.asked - self.taken

    def figures(self) -> Tuple[Dict[str, float], int]:
        """(scalars for this report, optimizer steps asked for since the last one)."""
        in_interval = self.skipped - self._reported
        asked = self.asked - self._asked_reported
        self._reported, self._asked_reported = self.skipped, self.asked
        return {'skipped_steps': float(self.skipped),
                'skipped_steps_interval': float(in_interval),
                'grad_scale': float(self.scaler.get_scale())}, asked

    def close(self) -> None:
        self._handle.remove()


class _IterEndStamp(Hook):
    """Marks the end of an iteration's hooks for :class:`GPUMonitorHook` (not in HOOKS)."""

    priority = 'LOWEST'

    def __init__(self, monitor: 'GPUMonitorHook') -> None:
        self.monitor = monitor

    def after_train_iter(self, runner, batch_idx: int, data_batch: DATA_BATCH = None,
                         outputs: Optional[dict] = None) -> None:
        self.monitor._stamp_iter_end()


@register(HOOKS)
class GPUMonitorHook(Hook):
    """Report GPU memory, NVML device stats, samples/s and data-wait share per interval.

    Written to the message hub as ``train/gpu_<key>`` (see ``docs/monitoring.md``):
    ``mem_alloc_mb``, ``mem_reserved_mb``, ``mem_peak_mb`` (torch's caching allocator,
    MiB); ``util_pct``, ``nvml_mem_used_mb``, ``power_w``, ``temp_c`` (NVML, for this
    rank's device); ``samples_per_s``, ``samples_per_s_global``, ``data_wait_share``;
    with ``across_ranks``: ``<key>_min`` / ``<key>_max`` for ``samples_per_s``,
    ``data_wait_share``, ``mem_peak_mb``, ``util_pct`` and ``data_wait_share_max_rank``.

    Mixed precision with loss scaling (an ``AmpOptimWrapper`` whose GradScaler is on):
    ``train/amp/skipped_steps`` (optimizer steps skipped since training started, i.e.
    loss-scale overflows: the parameters did not change), ``train/amp/
    skipped_steps_interval`` (those of this interval) and ``train/amp/grad_scale`` (the
    loss scale now; not named ``loss_scale`` because mmengine's LogProcessor averages
    every key containing "loss" over its window). A warning names an interval in which
    every optimizer step was skipped. The count adds no GPU sync (a step post-hook on
    the optimizer); the scale is read once per report.

    Timing: ``data_wait_share`` is the time from the end of one iteration's last hook
    to the start of the next iteration (the train loop's ``next(dataloader)``) over the
    wall time of the interval; ``samples_per_s`` is samples over that wall time, with
    validation left out. A small companion hook at LOWEST priority stamps the end of
    each iteration, so logging and checkpointing do not count as data wait.

    Peak memory: mmengine's LogProcessor resets the CUDA peak counter each time the
    LoggerHook logs (train and val). This hook reads the counter just before every such
    reset and keeps the maximum, so ``mem_peak_mb`` is the peak since the last report
    (exactly so when ``interval`` is a multiple of the LoggerHook's; otherwise it may
    include part of the previous interval, and an interval that contains a validation
    includes validation's peak).

    Priority 55: after IterTimerHook (NORMAL, 50) and before LoggerHook (BELOW_NORMAL,
    60), so the LoggerHook logs this iteration's figures, and this hook reads the CUDA
    peak-memory counter before the LogProcessor resets it.

    Args:
        interval (int, optional): report every ``interval`` training iterations (and at
            the end of each epoch). Defaults to None: the LoggerHook's interval (10 when
            there is no LoggerHook).
        starvation_threshold (float): warn when the share of iteration time spent
            waiting for data exceeds this (0 < x <= 1; the largest share across ranks
            when ``across_ranks``). Defaults to 0.2.
        starvation_warn_every (int): warn at most once per this many reports.
            Defaults to 10.
        across_ranks (bool): in distributed runs, gather the figures of all ranks once
            per report (one small all_gather) and log their min / max. Defaults to True.
        nvml (bool): query NVML (``nvidia-ml-py``) for utilisation, device memory,
            power and temperature. Defaults to True.
        amp (bool): report the loss scaler's skipped steps and scale when the optim
            wrapper scales the loss (fp16 AMP). Defaults to True.
    """

    priority = 55

    def __init__(self,
                 interval: Optional[int] = None,
                 starvation_threshold: float = 0.2,
                 starvation_warn_every: int = 10,
                 across_ranks: bool = True,
                 nvml: bool = True,
                 amp: bool = True) -> None:
        if interval is not None and (not isinstance(interval, int) or interval <= 0):
            raise ValueError(f'GPUMonitorHook: interval must be a positive int or None '
                             f'(the LoggerHook\'s interval), got {interval!r}.')
        if not 0 < starvation_threshold <= 1:
            raise ValueError(
                f'GPUMonitorHook: starvation_threshold is a share of iteration time in '
                f'(0, 1], got {starvation_threshold!r} (e.g. 0.2 warns above 20%).')
        if not isinstance(starvation_warn_every, int) or starvation_warn_every <= 0:
            raise ValueError(f'GPUMonitorHook: starvation_warn_every must be a positive '
                             f'int (reports), got {starvation_warn_every!r}.')
        self.interval = interval
        self._interval = interval or 10
        self.starvation_threshold = starvation_threshold
        self.starvation_warn_every = starvation_warn_every
        self.across_ranks = across_ranks
        self.nvml = nvml
        self.amp = amp
        self._skipped: Optional[_SkippedSteps] = None
        self._device: Optional[torch.device] = None
        self._nvml_device: Optional[_NvmlDevice] = None
        self._loggers: List[LoggerHook] = []
        self._reports = 0
        self._last_warning: Optional[int] = None
        self._batch_size_warned = False
        self._t_last: Optional[float] = None
        self._val_start: Optional[float] = None
        self._stamp: Optional['_IterEndStamp'] = None
        self._reset_window()

    # -- set-up ---------------------------------------------------------------------

    def before_train(self, runner) -> None:
        if self._stamp is None:
            # Inserted behind every other hook (LOWEST) so that the data wait measured
            # in before_train_iter excludes logging and checkpointing.
            self._stamp = _IterEndStamp(self)
            runner.register_hook(self._stamp, priority='LOWEST')
        self._loggers = [h for h in runner.hooks if isinstance(h, LoggerHook)]
        if self.interval is None and self._loggers:
            self._interval = self._loggers[0].interval
        self._device = self._cuda_device(runner)
        if self._device is None:
            print_log('GPUMonitorHook: no CUDA device in use, so no GPU memory or NVML '
                      'figures; data-wait share and samples/s are still reported.',
                      logger='current')
        elif self.nvml:
            self._nvml_device = self._open_nvml(self._device)
        if self.amp:
            self._attach_amp(runner.optim_wrapper)
        self._reset_window()

    def _attach_amp(self, wrapper: Any) -> None:
        if self._skipped is not None:
            self._skipped.close()
            self._skipped = None
        scaler, why_not = _SkippedSteps.scaler_of(wrapper)
        if scaler is None:
            print_log(f'GPUMonitorHook: {why_not}: no amp/ figures.', logger='current')
            return
        self._skipped = _SkippedSteps(wrapper)
        print_log('GPUMonitorHook: loss scaling is on: reporting amp/skipped_steps '
                  '(loss-scale overflows) and amp/grad_scale.', logger='current')

    def after_train(self, runner) -> None:
        if self._nvml_device is not None:
            self._nvml_device.close()
            self._nvml_device = None
        if self._skipped is not None:
            self._skipped.close()

    @staticmethod
    def _cuda_device(runner) -> Optional[torch.device]:
        if not torch.cuda.is_available():
            return None
        param = next(runner.model.parameters(), None)
        if param is not None and param.device.type != 'cuda':
            return None
        return param.device if param is not None else torch.device(
            'cuda', torch.cuda.current_device())

    @staticmethod
    def _open_nvml(device: torch.device) -> Optional[_NvmlDevice]:
        try:
            import pynvml
        except ImportError:
            print_log('GPUMonitorHook: nvml=True but nvidia-ml-py is not installed '
                      '(`pip install nvidia-ml-py`); utilisation, power and temperature '
                      'are left out. Set nvml=False to silence this.', logger='current',
                      level=logging.WARNING)
            return None
        try:
            return _NvmlDevice(pynvml, device.index)
        except pynvml.NVMLError as err:
            print_log(f'GPUMonitorHook: NVML is not usable here ({err}); utilisation, '
                      'power and temperature are left out.', logger='current',
                      level=logging.WARNING)
            return None

    # -- per iteration: timestamps and a len() only -----------------------------------

    def _reset_window(self, start: Optional[float] = None) -> None:
        self._window_start = time.perf_counter() if start is None else start
        self._excluded_s = 0.0
        self._iters = 0
        self._samples = 0
        self._sized_iters = 0
        self._wait_s = 0.0
        self._peak_bytes = 0

    def _stamp_iter_end(self) -> None:
        """Called by :class:`_IterEndStamp` after every other after_train_iter hook."""
        self._t_last = time.perf_counter()

    def before_train_epoch(self, runner) -> None:
        self._t_last = time.perf_counter()
        if self._iters == 0:
            # Time between epochs (checkpoints, validation) belongs to no window.
            self._reset_window(self._t_last)

    def before_train_iter(self, runner, batch_idx: int, data_batch: DATA_BATCH = None) -> None:
        # From the end of the previous iteration's last hook to here, the train loop
        # does nothing but ``next(dataloader)``: that is the data wait.
        now = time.perf_counter()
        self._wait_s += now - (self._t_last if self._t_last is not None else now)

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch: DATA_BATCH = None,
                         outputs: Optional[dict] = None) -> None:
        # No CUDA sync is added for the host clock to cover GPU work: RuntimeInfoHook
        # already turns the loss tensors into floats (``.item()``) every iteration.
        self._iters += 1
        self._count_samples(data_batch)
        if self._skipped is not None:
            self._skipped.after_iter(runner)
        if self._device is not None and self._logger_resets_peak(runner, batch_idx):
            self._fold_peak()
        if self._is_report_iter(runner, batch_idx):
            self._report(runner)

    def before_val_epoch(self, runner) -> None:
        self._val_start = time.perf_counter()
        # Validation LoggerHook calls reset the peak counter too: keep training's peak.
        if self._device is not None:
            self._fold_peak()

    def after_val_epoch(self, runner, metrics: Optional[Dict[str, float]] = None) -> None:
        # Validation inside a training epoch (IterBasedTrainLoop) is neither data wait
        # nor training time.
        now = time.perf_counter()
        if self._val_start is not None:
            self._excluded_s += now - self._val_start
        self._val_start = None
        self._t_last = now

    def _count_samples(self, data_batch: DATA_BATCH) -> None:
        size = batch_size_of(data_batch)
        if size is None:
            if not self._batch_size_warned:
                self._batch_size_warned = True
                print_log(f'GPUMonitorHook: cannot tell the batch size of a '
                          f'{type(data_batch).__name__} batch; samples/s is not reported.',
                          logger='current', level=logging.WARNING)
            return
        self._samples += size
        self._sized_iters += 1

    # -- peak memory ------------------------------------------------------------------

    def _logger_resets_peak(self, runner, batch_idx: int) -> bool:
        """True when a LoggerHook logs in this iteration, right after this hook.

        mmengine's LogProcessor reads ``max_memory_allocated`` and then calls
        ``torch.cuda.reset_peak_memory_stats`` every time it formats a log line, so a
        peak that is not read here first would be lost to this hook.
        """
        for logger in self._loggers:
            if self.every_n_inner_iters(batch_idx, logger.interval):
                return True
            if (self.end_of_epoch(runner.train_dataloader, batch_idx)
                    and (not logger.ignore_last
                         or len(runner.train_dataloader) <= logger.interval)):
                return True
        return False

    def _fold_peak(self) -> None:
        self._peak_bytes = max(self._peak_bytes,
                               torch.cuda.max_memory_allocated(self._device))

    def _memory_figures(self) -> Dict[str, float]:
        self._fold_peak()
        if not self._loggers:
            # Nobody else resets the counter: do it so the next peak is this interval's.
            torch.cuda.reset_peak_memory_stats(self._device)
        return {
            'mem_alloc_mb': torch.cuda.memory_allocated(self._device) / MB,
            'mem_reserved_mb': torch.cuda.memory_reserved(self._device) / MB,
            'mem_peak_mb': self._peak_bytes / MB,
        }

    # -- report -----------------------------------------------------------------------

    def _is_report_iter(self, runner, batch_idx: int) -> bool:
        return (self.every_n_inner_iters(batch_idx, self._interval)
                or self.end_of_epoch(runner.train_dataloader, batch_idx))

    def _window_figures(self, now: float) -> Dict[str, float]:
        total_s = now - self._window_start - self._excluded_s
        values: Dict[str, float] = {}
        if total_s > 0:
            values['data_wait_share'] = min(self._wait_s / total_s, 1.0)
            if self._sized_iters == self._iters:
                values['samples_per_s'] = self._samples / total_s
        return values

    def _report(self, runner) -> None:
        # The next window starts now, so this report's own cost is counted in it.
        now = time.perf_counter()
        values = self._window_figures(now)
        if self._device is not None:
            values.update(self._memory_figures())
            if self._nvml_device is not None:
                values.update(self._nvml_device.read())
        world_size = get_world_size()
        if 'samples_per_s' in values:
            values['samples_per_s_global'] = values['samples_per_s'] * world_size
        worst_wait = values.get('data_wait_share')
        if self.across_ranks and is_distributed() and world_size > 1:
            spread = self._across_ranks(values)
            values.update(spread)
            worst_wait = spread.get('data_wait_share_max', worst_wait)
        for key, value in values.items():
            runner.message_hub.update_scalar(PREFIX + key, value)
        if self._skipped is not None:
            self._report_amp(runner)
        self._warn_if_starved(values, worst_wait, runner.iter + 1)
        self._reports += 1
        self._reset_window(now)

    def _report_amp(self, runner) -> None:
        figures, asked = self._skipped.figures()
        for key, value in figures.items():
            runner.message_hub.update_scalar(AMP_PREFIX + key, value)
        if asked and figures['skipped_steps_interval'] == asked:
            # The iteration makes the text unique (MMLogger drops repeated warnings).
            print_log(
                f'GPUMonitorHook: all {asked} optimizer steps up to iteration '
                f'{runner.iter + 1} were skipped by loss scaling (inf/nan gradients), so '
                f'no parameter changed; loss scale now {figures["grad_scale"]:g}. Use bf16 '
                "(amp = dict(dtype='bfloat16' or 'auto')) or a smaller initial scale "
                "(amp.loss_scale=dict(init_scale=...)); see docs/monitoring.md.",
                logger='current', level=logging.WARNING)

    def _across_ranks(self, values: Dict[str, float]) -> Dict[str, float]:
        """Min / max over ranks with one all_gather of a few floats (NaN = not known)."""
        local = torch.tensor([values.get(k, math.nan) for k in ACROSS_RANK_KEYS],
                             dtype=torch.float64)
        local = local.to(get_comm_device())
        gathered = [torch.empty_like(local) for _ in range(get_world_size())]
        torch_dist.all_gather(gathered, local)
        table = torch.stack(gathered).cpu()  # ranks x keys
        spread: Dict[str, float] = {}
        for col, key in enumerate(ACROSS_RANK_KEYS):
            column = table[:, col]
            known = ~torch.isnan(column)
            if not bool(known.all()):
                continue
            spread[f'{key}_min'] = float(column.min())
            spread[f'{key}_max'] = float(column.max())
            if key == 'samples_per_s':
                spread['samples_per_s_global'] = float(column.sum())
            if key == 'data_wait_share':
                spread['data_wait_share_max_rank'] = float(int(column.argmax()))
        return spread

    def _warn_if_starved(self, values: Dict[str, float], share: Optional[float],
                         iteration: int) -> None:
        if share is None or share <= self.starvation_threshold:
            return
        if (self._last_warning is not None
                and self._reports - self._last_warning < self.starvation_warn_every):
            return
        self._last_warning = self._reports
        # The iteration makes every warning's text unique: mmengine 0.10's MMLogger
        # (FilterDuplicateWarning) drops a WARNING whose text it has logged before.
        where = ''
        if 'data_wait_share_max_rank' in values:
            where = f' (worst: rank {int(values["data_wait_share_max_rank"])})'
        print_log(
            f'GPUMonitorHook: the data loader starves training: {share:.0%} of iteration '
            f'time was spent waiting for data over the {self._iters} iterations up to '
            f'iteration {iteration}{where}, above starvation_threshold={self.starvation_threshold}. Raise '
            f'train_dataloader.num_workers, set persistent_workers=True / pin_memory=True, '
            f'or move the data to faster storage. (Repeated at most every '
            f'{self.starvation_warn_every} reports.)',
            logger='current', level=logging.WARNING)
