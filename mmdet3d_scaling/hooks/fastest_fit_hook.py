"""FastestFitHook: train in the fastest arrangement (per-GPU batch, checkpointing) that
fits a memory budget, with the effective batch of the scaling recipe.

Runs in ``before_run`` of training, where :class:`AutoBatchSizeHook` runs and for the same
reasons (the loop, optim wrapper and schedulers are built; weights, resume and the
accumulation counters are not yet): the plan it applies replaces them before anything
reads them.
"""
import copy
import logging
import os.path as osp
from typing import Any, Dict, List, Optional, Sequence, Union

import torch
from mmengine import dist
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper

from mmdet3d.registry import HOOKS

from ..batch_size.arrangements import (ArrangementFinder, CheckpointSwitch, FitResult,
                                       ModeledCheckpointingProbe, format_bytes,
                                       format_trials, preference_order)
from ..batch_size.cache import ResultCache, cache_key
from ..utils.memory_size import parse_memory_budget
from ..batch_size.memory_probe import CudaMemoryProbe, MemoryProbe, ModeledMemoryProbe
from ..batch_size.samples import LargestSampleBatches
from ..batch_size.search import agree_min
from ..config.validators import merge
from ..engine.optim_state import optim_wrappers
from ..engine.runner import require_scaling_runner
from ..registry import register

PROBE_TYPES = {'ModeledMemoryProbe': ModeledMemoryProbe,
               'ModeledCheckpointingProbe': ModeledCheckpointingProbe}


class FitCache(ResultCache):
    """:class:`~mmdet3d_scaling.batch_size.cache.ResultCache` of :class:`FitResult`
    entries (they share the auto batch size's file; the keys differ)."""

    def get(self, key: str) -> Optional[FitResult]:
        entry = self._read().get(key)
        return None if entry is None else FitResult.from_dict(entry)


@register(HOOKS)
class FastestFitHook(Hook):
    """Choose the per-GPU batch and gradient checkpointing that train fastest in memory.

    Arrangements are tried in a preference order: the largest batch without
    checkpointing, the same with the checkpointing the config enables (``with_cp``,
    ``checkpoint_modules``), then smaller batches likewise. Each trial trains a few real
    steps on the dataset's largest samples with the device limited to ``(1 - margin)``
    of the memory budget (``torch.cuda.set_per_process_memory_fraction``); those that
    fit are timed, and the fastest in samples/s is chosen (an earlier one unless a later
    one is faster by ``min_gain``). Precision is the config's ``amp`` (``dtype='auto'``:
    bf16 where the GPU has it, else fp16). The choice, its speed and memory are logged;
    the per-GPU batch and accumulation keep ``scaling.total_batch_size``; the result is
    cached in the work dir like the auto batch size's. All ranks train in the same
    arrangement: the fastest that fits on every rank, by the slowest rank's speed.

    Turned on by ``scaling = dict(total_batch_size=..., memory_budget='24GiB')``; put
    the hook in ``custom_hooks`` only to change its other options.

    Args:
        memory_budget: GPU memory to fit in: GiB as a number or a string with a unit
            ('24GiB', '1536MiB', '24GB'). Defaults to None: ``scaling.memory_budget``,
            else the whole device. Above the device's memory, the device's is used.
        margin: share of the budget kept free in the trials, in [0, 1). Defaults to 0.1.
        batch_sizes: per-GPU batches to try. Defaults to None: the divisors of
            ``total_batch_size / world_size`` up to the recipe's per-GPU batch (the
            config's ``train_dataloader.batch_size`` capped by the total), or only
            ``scaling.per_gpu_batch_size`` when that is a number.
        try_checkpointing: also try each batch with the configured checkpointing; False
            turns it off for every arrangement tried. Defaults to True.
        warmup_steps: untimed training steps per trial. Defaults to 2.
        timed_steps: timed training steps per trial. Defaults to 3.
        min_gain: share by which a later arrangement in the preference order must be
            faster to be chosen. Defaults to 0.02.
        num_candidates: distinct large samples in trial batches. Defaults to 16.
        scan_limit: data infos scanned to find them. Defaults to 1000.
        cache_file: JSON file of results, relative to the work dir. Defaults to
            'auto_batch_size.json'.
        use_cache: reuse a cached result for the same setting. Defaults to True.
        probe: memory probe: None (the CUDA device; without one the hook warns and keeps
            the configured arrangement), a probe object, or a dict
            ``type='ModeledMemoryProbe'`` / ``'ModeledCheckpointingProbe'`` with its
            arguments (CPU dry runs and tests).
    """

    priority = 'HIGHEST'  # before any hook reads the batch size or the loop length

    def __init__(self, memory_budget: Union[None, int, float, str] = None,
                 margin: float = 0.1, batch_sizes: Optional[Sequence[int]] = None,
                 try_checkpointing: bool = True, warmup_steps: int = 2,
                 timed_steps: int = 3, min_gain: float = 0.02, num_candidates: int = 16,
                 scan_limit: int = 1000, cache_file: str = 'auto_batch_size.json',
                 use_cache: bool = True, probe: Union[None, dict, MemoryProbe] = None):
        if memory_budget is not None:
            parse_memory_budget(memory_budget, 'FastestFitHook memory_budget')
        if not 0 <= margin < 1:
            raise ValueError(f'FastestFitHook: margin must be in [0, 1), got {margin}')
        if batch_sizes is not None and (
                not batch_sizes or any(isinstance(b, bool) or not isinstance(b, int)
                                       or b < 1 for b in batch_sizes)):
            raise ValueError(f'FastestFitHook: batch_sizes must be positive integers, '
                             f'got {batch_sizes!r}')
        self.memory_budget = memory_budget
        self.margin = margin
        self.batch_sizes = None if batch_sizes is None else list(batch_sizes)
        self.try_checkpointing = try_checkpointing
        self.warmup_steps = warmup_steps
        self.timed_steps = timed_steps
        self.min_gain = min_gain
        self.num_candidates = num_candidates
        self.scan_limit = scan_limit
        self.cache_file = cache_file
        self.use_cache = use_cache
        self.probe = probe
        self.result: Optional[FitResult] = None
        self.plan: Any = None
        self._done = False

    # ------------------------------------------------------------------ entry point
    def before_run(self, runner) -> None:
        """Search (or read the cache), then apply the chosen arrangement."""
        if self._done or not require_scaling_runner(
                runner, 'FastestFitHook').train_loop_built:
            return
        self._done = True
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        total, world_size, fixed = self._recipe(runner)
        switch = CheckpointSwitch(model)
        arrangements = preference_order(
            self._batch_sizes(runner, total, world_size, fixed),
            switch.available and self.try_checkpointing)
        probe = self._build_probe(model, runner.optim_wrapper)
        if probe is None:
            return
        try:
            self._find_and_apply(runner, model, probe, switch, arrangements, total,
                                 world_size)
        finally:
            if isinstance(self.probe, dict):  # built here: take its forward hook off
                probe.detach()

    def _find_and_apply(self, runner, model, probe: MemoryProbe, switch: CheckpointSwitch,
                        arrangements: list, total: int, world_size: int) -> None:
        budget = self._budget(runner)
        if not switch.available:
            runner.logger.info('fastest fit: the model has no gradient checkpointing '
                               'configured (with_cp), so only batch sizes are compared.')
        elif not self.try_checkpointing:
            runner.logger.info('fastest fit: try_checkpointing=False: every arrangement '
                               'without the configured checkpointing '
                               f'({switch.describe()}).')
        key = cache_key(self._key_parts(runner, model, probe, world_size, arrangements,
                                        budget))
        cache = FitCache(osp.join(runner.work_dir, self.cache_file))
        result = self._cached(cache, key) if self.use_cache else None
        if result is None:
            loader = runner.train_dataloader
            batches = LargestSampleBatches(loader.dataset, loader.collate_fn,
                                           num_candidates=self.num_candidates,
                                           scan_limit=self.scan_limit)
            result = ArrangementFinder(
                model, runner.optim_wrapper, batches, probe, switch, arrangements,
                budget_bytes=budget, margin=self.margin, warmup_steps=self.warmup_steps,
                timed_steps=self.timed_steps, min_gain=self.min_gain).search()
            if dist.is_main_process():
                cache.put(key, result)
        self.result = result
        switch.set(result.checkpointing)
        self.plan = self._make_plan(runner, total, world_size, result.batch_size)
        runner.logger.info(self._describe(runner, result, switch, cache.path))
        runner.apply_plan(self.plan, 'fastest fit')

    # ------------------------------------------------------------------- the setting
    @staticmethod
    def _recipe(runner):
        """Total batch, world size and a fixed per-GPU batch (or None) of the recipe."""
        from ..config.scaling_recipe import recorded_plan
        scaling = runner.cfg.get('scaling') or {}
        if 'total_batch_size' not in scaling or recorded_plan(runner.cfg) is None:
            raise ValueError(
                'FastestFitHook keeps the effective batch of the scaling recipe: add '
                'scaling = dict(total_batch_size=..., memory_budget=...) to the config '
                "(with runner_type='ScalingRunner').")
        fixed = scaling.get('per_gpu_batch_size')
        if fixed == 'auto':
            raise ValueError("FastestFitHook chooses the per-GPU batch itself; scaling."
                             "per_gpu_batch_size='auto' asks AutoBatchSizeHook for the "
                             'largest one: remove one of them.')
        return int(scaling['total_batch_size']), dist.get_world_size(), fixed

    def _batch_sizes(self, runner, total: int, world_size: int,
                     fixed: Optional[int]) -> List[int]:
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
        if fixed is not None:
            return [int(fixed)]
        upper = runner.train_dataloader.batch_size  # the recipe's per-GPU batch
        return [d for d in range(1, upper + 1) if per_rank % d == 0]

    def _budget(self, runner) -> Optional[int]:
        """Bytes of the budget: the hook's or ``scaling.memory_budget`` (must agree)."""
        scaling = runner.cfg.get('scaling') or {}
        sources = [('FastestFitHook memory_budget', self.memory_budget),
                   ('scaling.memory_budget', scaling.get('memory_budget'))]
        parsed = [(where, None if value is None else parse_memory_budget(value, where))
                  for where, value in sources]
        return merge('memory budget (bytes)', parsed)

    def _build_probe(self, model, optim_wrapper) -> Optional[MemoryProbe]:
        if isinstance(self.probe, dict):
            cfg = dict(self.probe)
            kind = cfg.pop('type', 'ModeledMemoryProbe')
            if kind not in PROBE_TYPES:
                raise ValueError(f'FastestFitHook: probe type {kind!r} unknown; a dict '
                                 f'probe must be one of {sorted(PROBE_TYPES)}')
            optimizers = [w.optimizer for w in optim_wrappers(optim_wrapper)]
            return PROBE_TYPES[kind](model, optimizers=optimizers, **cfg)
        if self.probe is not None:
            return self.probe
        if not torch.cuda.is_available():
            print_log('FastestFitHook: no CUDA device, so no memory to fit: keeping the '
                      'configured batch and checkpointing. (Pass probe=dict(type='
                      "'ModeledCheckpointingProbe', capacity_bytes=...) for a dry run.)",
                      logger='current', level=logging.WARNING)
            return None
        return CudaMemoryProbe()

    def _cached(self, cache: FitCache, key: str) -> Optional[FitResult]:
        """The cached result when every rank has it (all ranks call this together)."""
        result = cache.get(key)
        if not agree_min(1 if result is not None else 0):
            return None
        result.from_cache = True
        return result

    def _key_parts(self, runner, model, probe: MemoryProbe, world_size: int,
                   arrangements: list, budget: Optional[int]) -> Dict[str, Any]:
        """What decides the result: model, data, optimizer and precision, devices,
        the arrangements and the search settings."""
        cfg = runner.cfg
        optim_cfg = copy.deepcopy(cfg.get('optim_wrapper') or {})
        optim_cfg.pop('accumulative_counts', None)  # set from the choice
        if isinstance(optim_cfg.get('optimizer'), dict):
            optim_cfg['optimizer'].pop('lr', None)  # scaled with the plan
        dataset = runner.train_dataloader.dataset
        devices = [(probe.device_name(), probe.capacity_bytes())]
        if world_size > 1:  # every rank's device: one key for all, written by rank 0
            devices = dist.all_gather_object(devices[0])
        return dict(
            model=cfg.get('model') or repr(model),
            dataset=(cfg.get('train_dataloader') or {}).get('dataset')
            or f'{type(dataset).__name__}:{len(dataset)}',
            optim_wrapper=optim_cfg or repr(runner.optim_wrapper.optimizer),
            activation_checkpointing=cfg.get('activation_checkpointing'),
            world_size=world_size, devices=[list(d) for d in devices],
            torch=torch.__version__,
            search=dict(trial='fastest-fit', budget=budget, margin=self.margin,
                        arrangements=[[a.batch_size, a.checkpointing]
                                      for a in arrangements],
                        warmup=self.warmup_steps, timed=self.timed_steps,
                        min_gain=self.min_gain, candidates=self.num_candidates,
                        scan_limit=self.scan_limit))

    # ------------------------------------------------------------- applying the choice
    @staticmethod
    def _make_plan(runner, total: int, world_size: int, batch: int):
        from ..config.scaling_recipe import make_plan, recorded_plan
        scaling = runner.cfg.get('scaling') or {}
        recorded = recorded_plan(runner.cfg)
        return make_plan(total, world_size, per_gpu_batch=batch,
                         base_batch_size=scaling.get('base_batch_size',
                                                     recorded.base_batch),
                         lr_scaling=scaling.get('lr_scaling', recorded.lr_scaling))

    @staticmethod
    def _precision(optim_wrapper) -> str:
        wrapper = optim_wrappers(optim_wrapper)[0]
        if type(wrapper).__name__ != 'AmpOptimWrapper':
            return 'fp32'
        dtype = getattr(wrapper, 'cast_dtype', None)
        return f'{str(dtype or torch.float16).replace("torch.", "")} autocast'

    def _describe(self, runner, result: FitResult, switch: CheckpointSwitch,
                  cache_path: str) -> str:
        checkpointing = (f'checkpointing on ({switch.describe()})' if result.checkpointing
                         else 'checkpointing off')
        source = (f'from the cache {cache_path} (no search)' if result.from_cache else
                  f'{len(result.trials)} trials in {result.seconds:.1f} s')
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
            + format_trials(result.trials, result.arrangement, result.limit_bytes))

