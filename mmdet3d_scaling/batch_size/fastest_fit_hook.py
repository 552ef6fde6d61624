"""FastestFitHook: train with the fastest fit, the per-GPU batch and gradient
checkpointing that train fastest in a memory budget, with the effective batch of the
scaling recipe.

Runs in ``before_run`` of training, as every search hook
(:class:`~.search_hook.BatchSizeSearchHook` says why there).
"""
from typing import List, Optional, Sequence

import torch
from mmengine import dist

from mmdet3d.registry import HOOKS

from ..engine.optim_state import optim_wrappers
from ..registry import register
from .checkpoint_switch import CheckpointSwitch
from .fastest_fit import FastestFitFinder, FitResult, format_trials, preference_order
from .memory_probe import MemoryProbe, ModeledCheckpointingProbe, ModeledMemoryProbe
from .search_hook import BatchSizeSearchHook
from .trial import format_bytes


@register(HOOKS)
class FastestFitHook(BatchSizeSearchHook):
    """Choose the per-GPU batch and gradient checkpointing that train fastest in memory.

    Variants are tried in a preference order: the largest batch without
    checkpointing, the same with the checkpointing the config enables (``with_cp``,
    ``checkpoint_modules``), then smaller batches likewise. Each trial trains a few real
    steps on the dataset's largest samples with the device limited to ``(1 - margin)``
    of the memory budget (``torch.cuda.set_per_process_memory_fraction``); those that
    fit are timed, and the fastest in samples/s is chosen (an earlier one unless a later
    one is faster by ``min_gain``). Precision is the config's ``amp`` (``dtype='auto'``:
    bf16 where the GPU has it, else fp16). The choice, its speed and memory are logged;
    the per-GPU batch and accumulation keep ``scaling.total_batch_size``; the result is
    cached in the work dir like the auto batch size's. All ranks train in the same
    variant: the fastest that fits on every rank, by the slowest rank's speed.

    Turned on by ``scaling = dict(total_batch_size=..., memory_budget='24GiB')``; put
    the hook in ``custom_hooks`` only to change its other options. Needs
    ``runner_type='ScalingRunner'``; priority ``HIGHEST``
    (:class:`~.search_hook.BatchSizeSearchHook`).

    Args:
        budget_bytes (int, optional): GPU memory to fit in, bytes: the config step's
            reading of ``scaling.memory_budget`` (or of ``memory_budget`` in this
            hook's config, as users write it: '24GiB', or GiB as a number); leave it
            unset. Defaults to None: the whole device. Above the device's memory, the
            device's is used.
        batch_sizes (list[int], optional): per-GPU batches to try. Defaults to None:
            the divisors of ``total_batch_size / world_size`` up to the recipe's
            per-GPU batch (the config's ``train_dataloader.batch_size`` capped by the
            total), or only ``scaling.per_gpu_batch_size`` when that is a number.
        try_checkpointing (bool): also try each batch with the configured
            checkpointing; False turns it off for every variant tried. Defaults to True.
        warmup_steps (int): untimed training steps per trial. Defaults to 2.
        timed_steps (int): timed training steps per trial. Defaults to 3.
        min_gain (float): share by which a later variant in the preference order must
            be faster to be chosen. Defaults to 0.02.
        **kwargs: the options of every search hook
            (:class:`~.search_hook.BatchSizeSearchHook`): ``margin`` (share of the
            budget kept free), ``num_candidates``, ``scan_limit``, ``cache_file``,
            ``use_cache``, ``probe`` (also ``'ModeledCheckpointingProbe'``),
            ``recipe``.
    """

    log_name = 'fastest fit'
    result_type = FitResult
    probe_types = {'ModeledMemoryProbe': ModeledMemoryProbe,
                   'ModeledCheckpointingProbe': ModeledCheckpointingProbe}

    def __init__(self, budget_bytes: Optional[int] = None,
                 batch_sizes: Optional[Sequence[int]] = None,
                 try_checkpointing: bool = True, warmup_steps: int = 2,
                 timed_steps: int = 3, min_gain: float = 0.02, **kwargs):
        super().__init__(**kwargs)
        if budget_bytes is not None and (isinstance(budget_bytes, bool) or not
                                         isinstance(budget_bytes, int) or
                                         budget_bytes < 1):
            raise ValueError(f'FastestFitHook: budget_bytes must be a positive number '
                             f'of bytes, got {budget_bytes!r} (scaling.memory_budget '
                             "takes '24GiB')")
        if batch_sizes is not None and (
                not batch_sizes or any(isinstance(b, bool) or not isinstance(b, int)
                                       or b < 1 for b in batch_sizes)):
            raise ValueError(f'FastestFitHook: batch_sizes must be positive integers, '
                             f'got {batch_sizes!r}')
        self.budget_bytes = budget_bytes
        self.batch_sizes = None if batch_sizes is None else list(batch_sizes)
        self.try_checkpointing = try_checkpointing
        self.warmup_steps = warmup_steps
        self.timed_steps = timed_steps
        self.min_gain = min_gain

    def _find_and_apply(self, runner, model, probe: MemoryProbe) -> None:
        if self.recipe is None:
            raise ValueError(
                'FastestFitHook keeps the effective batch of the scaling recipe: add '
                'scaling = dict(total_batch_size=..., memory_budget=...) to the config '
                "(with runner_type='ScalingRunner').")
        world_size = dist.get_world_size()
        switch = CheckpointSwitch(model)
        variants = preference_order(self._batch_sizes(runner, world_size),
                                    switch.available and self.try_checkpointing)
        self._log_switch(runner, switch)
        search = dict(trial='fastest-fit', budget=self.budget_bytes, margin=self.margin,
                      variants=[[v.batch_size, v.checkpointing] for v in variants],
                      warmup=self.warmup_steps, timed=self.timed_steps,
                      min_gain=self.min_gain, candidates=self.num_candidates,
                      scan_limit=self.scan_limit)
        result = self._cached_or_search(
            runner, model, probe, search,
            lambda: FastestFitFinder(
                model, runner.optim_wrapper, self._batches(runner), probe, switch,
                variants, budget_bytes=self.budget_bytes, margin=self.margin,
                warmup_steps=self.warmup_steps, timed_steps=self.timed_steps,
                min_gain=self.min_gain).search())
        self.result = result
        switch.set(result.checkpointing)
        plan = self._recipe_plan(world_size, per_gpu_batch=result.batch_size)
        self.plan = plan
        runner.logger.info(self._describe(runner, result, switch))
        self._apply(runner, plan)

    def _log_switch(self, runner, switch: CheckpointSwitch) -> None:
        if not switch.available:
            runner.logger.info('fastest fit: the model has no gradient checkpointing '
                               'configured (with_cp), so only batch sizes are compared.')
        elif not self.try_checkpointing:
            runner.logger.info('fastest fit: try_checkpointing=False: every variant '
                               'without the configured checkpointing '
                               f'({switch.describe()}).')

    def _batch_sizes(self, runner, world_size: int) -> List[int]:
        total = self.recipe['total_batch_size']
        per_rank = total // world_size
        if self.batch_sizes is not None:
            wrong = [b for b in self.batch_sizes if per_rank % b]
            if wrong:
                divisors = [d for d in range(1, per_rank + 1) if per_rank % d == 0]
                raise ValueError(
                    f'FastestFitHook: batch_sizes {wrong} do not divide the {per_rank} '
                    f'samples per GPU per optimizer step (total_batch_size={total} over '
                    f'{world_size} GPUs); use divisors of {per_rank}: {divisors}.')
            return list(self.batch_sizes)
        fixed = self.recipe['per_gpu_batch_size']
        if fixed is not None:
            return [int(fixed)]
        upper = runner.train_dataloader.batch_size  # the recipe's per-GPU batch
        return [d for d in range(1, upper + 1) if per_rank % d == 0]

    # ------------------------------------------------------------- the log line
    @staticmethod
    def _precision(optim_wrapper) -> str:
        wrapper = optim_wrappers(optim_wrapper)[0]
        if type(wrapper).__name__ != 'AmpOptimWrapper':
            return 'fp32'
        dtype = getattr(wrapper, 'cast_dtype', None)
        return f'{str(dtype or torch.float16).replace("torch.", "")} autocast'

    def _describe(self, runner, result: FitResult, switch: CheckpointSwitch) -> str:
        checkpointing = (f'checkpointing on ({switch.describe()})' if result.checkpointing
                         else 'checkpointing off')
        source = (f'from the cache {self.cache_path} (no search)' if result.from_cache
                  else f'{len(result.trials)} trials in {result.seconds:.1f} s')
        plan, size = self.plan, format_bytes
        return (
            f'fastest fit: per-GPU batch {result.batch_size}, {checkpointing}, '
            f'{self._precision(runner.optim_wrapper)}: {result.samples_per_s:.2f} '
            f'samples/s in the trial; peak after warm-up '
            f'{size(result.peak_allocated_bytes)} allocated, '
            f'{size(result.peak_reserved_bytes)} reserved, within '
            f'{size(result.limit_bytes)} ({result.margin:.0%} of the '
            f'{size(result.budget_bytes)} budget kept free) on {result.device_name}; '
            f'{source}; {plan.world_size} GPU(s) x {plan.per_gpu_batch} x '
            f'{plan.accumulation} accumulation = {plan.total_batch}.\n'
            + format_trials(result.trials, result.variant, result.limit_bytes))

