"""GPUMonitorHook: per-interval GPU memory, NVML device stats, throughput and data wait.

Everything is written to ``runner.message_hub`` under ``train/gpu_*`` (and ``train/amp/*``
for the loss scaler of mixed precision) so that the LoggerHook puts it into the text
log, the JSON scalars and TensorBoard. The hook decides *when* (hook points, report
iterations, LoggerHook resets of the peak counter) and writes the figures; *what* is
measured lives in :mod:`mmdet3d_scaling.monitoring`, one collaborator a job: the step
timer (samples/s, data wait), CUDA memory, the NVML sampler, the AMP skip counter and
the cross-rank summary. The per-iteration work is a few ``time.perf_counter()`` calls,
a ``len()`` and integer counters; CUDA counters, the loss scale, NVML and the
cross-rank gather are touched only at report time (once per interval).
"""
import logging
import time
from typing import Any, Dict, List, Optional, Union

import torch
from mmengine.dist import get_world_size, is_distributed
from mmengine.hooks import Hook, LoggerHook
from mmengine.logging import print_log

from mmdet3d.registry import HOOKS

from ..monitoring.amp_skips import AmpSkips, loss_scaler_of
from ..monitoring.cuda_memory import CudaMemory
from ..monitoring.nvml_sampler import NvmlSampler, open_nvml
from ..monitoring.rank_summary import across_ranks
from ..monitoring.step_timer import StepTimer, batch_size_of
from ..registry import register
from .optimizer_step_param_scheduler_hook import optimizer_stepped

__all__ = ['GPUMonitorHook', 'batch_size_of']

DATA_BATCH = Optional[Union[dict, tuple, list]]
PREFIX = 'train/gpu_'
AMP_PREFIX = 'train/amp/'
#: ``mem_local_mb`` above this (MiB) is named once a run: memory the allocator cannot use
LOCAL_MEMORY_WARN_MB = 1024


def local_memory_warning(local_mb: Optional[float], iteration: int) -> Optional[str]:
    """The warning for ``local_mb`` MiB of kept local memory, or None below
    :data:`LOCAL_MEMORY_WARN_MB` (or where the driver could not say)."""
    if local_mb is None or local_mb <= LOCAL_MEMORY_WARN_MB:
        return None
    return (f'GPUMonitorHook: at iteration {iteration} the CUDA driver keeps '
            f'{local_mb / 1024:.1f} GiB of this GPU for kernels\' local memory '
            '(gpu_mem_local_mb), outside PyTorch\'s allocator, which cannot use it. '
            "mmcv's strided sparse convolution does this (mmdet3d's sparse encoders "
            'without spconv): install spconv 2.x (pip install "mmdet3d-scaling'
            '[spconv-cu126]" or the spconv wheel of your CUDA); see '
            'docs/failure_modes.md#memory.')


class _IterEndStamp(Hook):
    """Marks the end of an iteration's hooks for :class:`GPUMonitorHook` (not in HOOKS).

    Args:
        timer: the monitor's step timer, told when every other after_train_iter ran.
    """

    priority = 'LOWEST'

    def __init__(self, timer: StepTimer) -> None:
        self.timer = timer

    def after_train_iter(self, runner, batch_idx: int, data_batch: DATA_BATCH = None,
                         outputs: Optional[dict] = None) -> None:
        """The iteration's hooks are done: the data wait starts now."""
        self.timer.iter_ended()


@register(HOOKS)
class GPUMonitorHook(Hook):
    """Report GPU memory, NVML device stats, samples/s and data-wait share per interval.

    Written to the message hub as ``train/gpu_<key>`` (see ``docs/monitoring.md``):
    ``mem_alloc_mb``, ``mem_reserved_mb``, ``mem_peak_mb`` (torch's caching allocator,
    MiB); ``mem_local_mb`` (what the CUDA driver keeps for kernels' local memory,
    outside the allocator; a warning once a run above 1 GiB names the likely cause,
    mmcv's strided sparse conv); ``util_pct``, ``nvml_mem_used_mb``, ``power_w``,
    ``temp_c`` (NVML, for this rank's device); ``samples_per_s``,
    ``samples_per_s_global``, ``data_wait_share``;
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
        self._timer = StepTimer()
        self._memory: Optional[CudaMemory] = None
        self._nvml_sampler: Optional[NvmlSampler] = None
        self._skips: Optional[AmpSkips] = None
        self._loggers: List[LoggerHook] = []
        self._reports = 0
        self._last_warning: Optional[int] = None
        self._batch_size_warned = False
        self._local_memory_warned = False
        self._stamp: Optional[_IterEndStamp] = None

    # -- set-up ---------------------------------------------------------------------

    def before_train(self, runner) -> None:
        """Find the device, open NVML and the AMP counter, add the end-of-iteration
        stamp hook and start the first window."""
        if self._stamp is None:
            # Inserted behind every other hook (LOWEST) so that the data wait measured
            # in before_train_iter excludes logging and checkpointing.
            self._stamp = _IterEndStamp(self._timer)
            runner.register_hook(self._stamp, priority='LOWEST')
        self._loggers = [h for h in runner.hooks if isinstance(h, LoggerHook)]
        if self.interval is None and self._loggers:
            self._interval = self._loggers[0].interval
        device = self._cuda_device(runner)
        self._memory = CudaMemory(device) if device is not None else None
        if device is None:
            print_log('GPUMonitorHook: no CUDA device in use, so no GPU memory or NVML '
                      'figures; data-wait share and samples/s are still reported.',
                      logger='current')
        elif self.nvml:
            self._nvml_sampler = open_nvml(device)
        if self.amp:
            self._attach_amp(runner.optim_wrapper)
        self._restart_window()

    def _attach_amp(self, wrapper: Any) -> None:
        if self._skips is not None:
            self._skips.close()
            self._skips = None
        scaler, why_not = loss_scaler_of(wrapper)
        if scaler is None:
            print_log(f'GPUMonitorHook: {why_not}: no amp/ figures.', logger='current')
            return
        self._skips = AmpSkips(wrapper)
        print_log('GPUMonitorHook: loss scaling is on: reporting amp/skipped_steps '
                  '(loss-scale overflows) and amp/grad_scale.', logger='current')

    def after_train(self, runner) -> None:
        """Close NVML and remove the AMP counter's optimizer hook."""
        if self._nvml_sampler is not None:
            self._nvml_sampler.close()
            self._nvml_sampler = None
        if self._skips is not None:
            self._skips.close()

    @staticmethod
    def _cuda_device(runner) -> Optional[torch.device]:
        if not torch.cuda.is_available():
            return None
        param = next(runner.model.parameters(), None)
        if param is not None and param.device.type != 'cuda':
            return None
        return param.device if param is not None else torch.device(
            'cuda', torch.cuda.current_device())

    def _restart_window(self, start: Optional[float] = None) -> None:
        self._timer.restart(start)
        if self._memory is not None:
            self._memory.restart()

    # -- per iteration: timestamps and a len() only -----------------------------------

    def before_train_epoch(self, runner) -> None:
        """Start the data-wait clock; a window with no iteration yet starts here (time
        between epochs, checkpoints and validation belongs to no window)."""
        now = self._timer.iter_ended()
        if self._timer.iters == 0:
            self._restart_window(now)

    def before_train_iter(self, runner, batch_idx: int,
                          data_batch: DATA_BATCH = None) -> None:
        """Count the time since the previous iteration's last hook as data wait."""
        # From the end of the previous iteration's last hook to here, the train loop
        # does nothing but ``next(dataloader)``: that is the data wait.
        self._timer.iter_started()

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch: DATA_BATCH = None,
                         outputs: Optional[dict] = None) -> None:
        """Count the batch and the AMP step; keep the CUDA peak before a LoggerHook
        resets it; report at the interval's last iteration."""
        # No CUDA sync is added for the host clock to cover GPU work: RuntimeInfoHook
        # already turns the loss tensors into floats (``.item()``) every iteration.
        self._count_samples(data_batch)
        if self._skips is not None:
            self._skips.after_iter(optimizer_stepped(runner))
        if self._memory is not None and self._logger_resets_peak(runner, batch_idx):
            self._memory.fold_peak()
        if self._is_report_iter(runner, batch_idx):
            self._report(runner)

    def before_val_epoch(self, runner) -> None:
        """Stop the clock for validation and keep training's CUDA peak (validation's
        LoggerHook resets the counter too)."""
        self._timer.pause()
        if self._memory is not None:
            self._memory.fold_peak()

    def after_val_epoch(self, runner, metrics: Optional[Dict[str, float]] = None) -> None:
        """Restart the clock: validation inside training (IterBasedTrainLoop) is neither
        data wait nor training time."""
        self._timer.resume()

    def _count_samples(self, data_batch: DATA_BATCH) -> None:
        size = batch_size_of(data_batch)
        self._timer.count(size)
        if size is None and not self._batch_size_warned:
            self._batch_size_warned = True
            print_log(f'GPUMonitorHook: cannot tell the batch size of a '
                      f'{type(data_batch).__name__} batch; samples/s is not reported.',
                      logger='current', level=logging.WARNING)

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

    # -- report -----------------------------------------------------------------------

    def _is_report_iter(self, runner, batch_idx: int) -> bool:
        return (self.every_n_inner_iters(batch_idx, self._interval)
                or self.end_of_epoch(runner.train_dataloader, batch_idx))

    def _report(self, runner) -> None:
        # The next window starts now, so this report's own cost is counted in it.
        now = time.perf_counter()
        values = self._timer.figures(now)
        if self._memory is not None:
            # Nobody else resets the counter without a LoggerHook: do it so the next
            # peak is this interval's.
            values.update(self._memory.figures(reset_counter=not self._loggers))
            if self._nvml_sampler is not None:
                values.update(self._nvml_sampler.read())
        world_size = get_world_size()
        if 'samples_per_s' in values:
            values['samples_per_s_global'] = values['samples_per_s'] * world_size
        worst_wait = values.get('data_wait_share')
        if self.across_ranks and is_distributed() and world_size > 1:
            spread = across_ranks(values)
            values.update(spread)
            worst_wait = spread.get('data_wait_share_max', worst_wait)
        for key, value in values.items():
            runner.message_hub.update_scalar(PREFIX + key, value)
        if self._skips is not None:
            self._report_amp(runner)
        self._warn_if_starved(values, worst_wait, runner.iter + 1)
        self._warn_of_local_memory(values.get('mem_local_mb'), runner.iter + 1)
        self._reports += 1
        self._restart_window(now)

    def _report_amp(self, runner) -> None:
        figures, asked = self._skips.figures()
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

    def _warn_of_local_memory(self, local_mb: Optional[float], iteration: int) -> None:
        if self._local_memory_warned:  # once a run: the memory stays until released
            return
        text = local_memory_warning(local_mb, iteration)
        if text is not None:
            self._local_memory_warned = True
            print_log(text, logger='current', level=logging.WARNING)

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
            f'time was spent waiting for data over the {self._timer.iters} iterations '
            f'up to iteration {iteration}{where}, above starvation_threshold='
            f'{self.starvation_threshold}. Raise '
            f'train_dataloader.num_workers, set persistent_workers=True / pin_memory=True, '
            f'or move the data to faster storage. (Repeated at most every '
            f'{self.starvation_warn_every} reports.)',
            logger='current', level=logging.WARNING)
