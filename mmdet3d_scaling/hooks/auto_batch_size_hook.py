"""AutoBatchSizeHook: train with the largest per-GPU batch that fits, same effective batch.

Runs in ``before_run`` of training, i.e. after mmengine has built the train loop, the
optim wrapper and the parameter schedulers, and before weights are initialised, a
checkpoint is resumed and the optim wrapper's accumulation counters are initialised. So
the pieces it replaces (dataloader, loop length, schedulers, accumulation) are in place
before anything reads them, and a resumed checkpoint's scheduler state lands on the
schedulers built for the new batch size.
"""
import copy
import logging
import os.path as osp
from typing import Any, Dict, Optional, Union

import torch
from mmengine import dist
from mmengine.hooks import Hook
from mmengine.logging import print_log

from mmdet3d.registry import HOOKS

from ..batch_size.cache import ResultCache, cache_key, lookup_agreed
from ..batch_size.memory_probe import CudaMemoryProbe, MemoryProbe, ModeledMemoryProbe
from ..batch_size.samples import LargestSampleBatches
from ..batch_size.search import BatchSizeFinder, SearchResult
from ..engine.optim_state import accumulation as optim_accumulation, optim_wrappers
from ..engine.runner import require_scaling_runner
from ..registry import register
from ..utils.model import unwrap_model

ADJUST_MODES = ('accumulation', 'lr')


@register(HOOKS)
class AutoBatchSizeHook(Hook):
    """Search the largest per-GPU batch before training and keep the effective batch.

    The search (:class:`~mmdet3d_scaling.batch_size.search.BatchSizeFinder`)
    trains a few real steps on batches of the dataset's largest samples, doubling then
    bisecting the batch, each trial with the device limited to ``1 - margin`` of its
    memory, so ``margin`` of device memory stays free. All ranks use the
    smallest batch any of them found. The result is cached in the work dir, keyed by the
    model / dataset / optimizer config, world size and device, so a resumed run reuses it.

    Then, with ``adjust='accumulation'`` (default), the per-GPU batch and the gradient
    accumulation are set so that per-GPU batch x world size x accumulation equals the
    effective batch the run was configured with (the per-GPU batch is the largest that
    fits and divides it). With ``adjust='lr'`` there is no accumulation: the effective
    batch becomes per-GPU batch x world size and the learning rate is scaled by the ratio
    of the new to the configured effective batch (``lr_scaling`` rule).

    Needs ``runner_type='ScalingRunner'`` (it applies the plan with
    :meth:`~mmdet3d_scaling.engine.runner.ScalingRunner.apply_plan`). Priority
    ``HIGHEST``: its ``before_run`` runs before any hook reads the batch size or the
    loop length.

    Args:
        margin (float): share of device memory kept free, in [0, 1). Defaults to 0.1.
        steps_per_trial (int): training steps per trial. Defaults to 2.
        init_batch_size (int): first per-GPU batch tried (samples). Defaults to 1.
        max_batch_size (int, optional): largest per-GPU batch tried (samples). Defaults
            to None: the configured effective batch / world size with
            ``adjust='accumulation'`` (a larger batch could not be used), else 256.
        adjust (str): 'accumulation' (keep the effective batch) or 'lr' (scale the LR).
            Defaults to 'accumulation'.
        lr_scaling (str): with ``adjust='lr'``: 'linear' or 'sqrt'. Defaults to
            'linear'.
        num_candidates (int): distinct large samples used to build trial batches.
            Defaults to 16.
        scan_limit (int): data infos scanned to find them. Defaults to 1000.
        cache_file (str): JSON file for results, relative to the work dir. Defaults to
            'auto_batch_size.json'.
        use_cache (bool): reuse a cached result for the same setting. Defaults to True.
        probe (dict | MemoryProbe, optional): memory probe: None (the CUDA device;
            without one the hook warns and keeps the configured batch), a probe object,
            or ``dict(type='ModeledMemoryProbe', capacity_bytes=..., ...)`` for a
            modelled device (CPU dry runs and tests). Defaults to None.
    """

    priority = 'HIGHEST'  # before any hook reads the batch size or the loop length

    def __init__(self, margin: float = 0.1, steps_per_trial: int = 2,
                 init_batch_size: int = 1, max_batch_size: Optional[int] = None,
                 adjust: str = 'accumulation', lr_scaling: str = 'linear',
                 num_candidates: int = 16, scan_limit: int = 1000,
                 cache_file: str = 'auto_batch_size.json', use_cache: bool = True,
                 probe: Union[None, dict, MemoryProbe] = None):
        if adjust not in ADJUST_MODES:
            raise ValueError(f'AutoBatchSizeHook: adjust={adjust!r} is not one of '
                             f'{ADJUST_MODES}')
        if lr_scaling not in ('linear', 'sqrt'):
            raise ValueError(f"AutoBatchSizeHook: lr_scaling={lr_scaling!r}: use 'linear' "
                             "or 'sqrt' (adjust='accumulation' keeps the LR as it is)")
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f'AutoBatchSizeHook: max_batch_size must be >= 1, got '
                             f'{max_batch_size}')
        if not 0 <= margin < 1:
            raise ValueError(f'AutoBatchSizeHook: margin must be in [0, 1), got {margin}')
        self.margin = margin
        self.steps_per_trial = steps_per_trial
        self.init_batch_size = init_batch_size
        self.max_batch_size = max_batch_size
        self.adjust = adjust
        self.lr_scaling = lr_scaling
        self.num_candidates = num_candidates
        self.scan_limit = scan_limit
        self.cache_file = cache_file
        self.use_cache = use_cache
        self.probe = probe
        self.result: Optional[SearchResult] = None
        self.plan: Any = None
        self._done = False

    # ------------------------------------------------------------------ entry point
    def before_run(self, runner) -> None:
        """Search the batch (or take it from the cache) and apply the new plan to the
        runner, once, before training; nothing for ``runner.val()`` / ``test()``."""
        # before_run also fires for runner.val()/test(); act once, when training.
        if self._done or not require_scaling_runner(
                runner, 'AutoBatchSizeHook').train_loop_built:
            return
        self._done = True
        model = unwrap_model(runner.model)
        probe = self._build_probe(model, runner.optim_wrapper)
        if probe is None:
            return
        try:
            self._find_and_apply(runner, model, probe)
        finally:
            if isinstance(self.probe, dict):  # built here: take its forward hook off
                probe.detach()

    def _find_and_apply(self, runner, model, probe: MemoryProbe) -> None:
        world_size = dist.get_world_size()
        current = self._current(runner, world_size)
        upper = self._upper_bound(runner, current, world_size)
        key = cache_key(self._key_parts(runner, model, probe, world_size, upper))
        cache = ResultCache(osp.join(runner.work_dir, self.cache_file))
        result = lookup_agreed(cache, key) if self.use_cache else None
        if result is not None:
            runner.logger.info(f'auto batch size: per-GPU batch {result.batch_size} '
                               f'from the cache {cache.path} (no search).')
        else:
            result = self._search(runner, model, probe, upper)
            if dist.is_main_process():
                cache.put(key, result)
        self.result = result
        self._apply(runner, current, result.batch_size, world_size)

    # ------------------------------------------------------------------- the search
    def _build_probe(self, model, optim_wrapper) -> Optional[MemoryProbe]:
        if isinstance(self.probe, dict):
            cfg = dict(self.probe)
            kind = cfg.pop('type', 'ModeledMemoryProbe')
            if kind != 'ModeledMemoryProbe':
                raise ValueError(f"AutoBatchSizeHook: probe type {kind!r} unknown; a dict "
                                 "probe must be type='ModeledMemoryProbe'")
            optimizers = [w.optimizer for w in optim_wrappers(optim_wrapper)]
            return ModeledMemoryProbe(model, optimizers=optimizers, **cfg)
        if self.probe is not None:
            return self.probe
        if not torch.cuda.is_available():
            print_log('AutoBatchSizeHook: no CUDA device, so no memory to fit: keeping '
                      'the configured batch size. (Pass probe=dict(type='
                      "'ModeledMemoryProbe', capacity_bytes=...) for a dry run.)",
                      logger='current', level=logging.WARNING)
            return None
        return CudaMemoryProbe()

    def _search(self, runner, model, probe: MemoryProbe, upper: int) -> SearchResult:
        loader = runner.train_dataloader
        batches = LargestSampleBatches(loader.dataset, loader.collate_fn,
                                       num_candidates=self.num_candidates,
                                       scan_limit=self.scan_limit)
        finder = BatchSizeFinder(
            model, runner.optim_wrapper, batches, probe, margin=self.margin,
            steps_per_trial=self.steps_per_trial,
            init_batch_size=min(self.init_batch_size, upper), max_batch_size=upper)
        result = finder.search()
        runner.logger.info(
            f'auto batch size: per-GPU batch {result.batch_size} (this rank: '
            f'{result.local_batch_size}) after {len(result.trials)} trials in '
            f'{result.seconds:.1f} s on {result.device_name}, keeping '
            f'{self.margin:.0%} of memory free.')
        if result.hit_upper_bound:
            runner.logger.info(f'auto batch size: every batch up to {upper} fits.')
        return result

    def _key_parts(self, runner, model, probe: MemoryProbe, world_size: int,
                   upper: int) -> Dict[str, Any]:
        """What decides the result: model, data, optimizer, devices, search settings."""
        cfg = runner.cfg
        loader_cfg = cfg.get('train_dataloader') or {}
        optim_cfg = copy.deepcopy(cfg.get('optim_wrapper') or {})
        optim_cfg.pop('accumulative_counts', None)  # set by this hook
        if isinstance(optim_cfg.get('optimizer'), dict):
            optim_cfg['optimizer'].pop('lr', None)  # may be scaled by this hook
        dataset = runner.train_dataloader.dataset
        devices = [(probe.device_name(), probe.capacity_bytes())]
        if world_size > 1:  # every rank's device: one key for all, written by rank 0
            devices = dist.all_gather_object(devices[0])
        return dict(
            model=cfg.get('model') or repr(model),
            dataset=loader_cfg.get('dataset') or f'{type(dataset).__name__}:{len(dataset)}',
            optim_wrapper=optim_cfg or repr(runner.optim_wrapper.optimizer),
            activation_checkpointing=cfg.get('activation_checkpointing'),
            world_size=world_size, devices=[list(d) for d in devices],
            torch=torch.__version__,
            # trial: how a trial is judged (a result judged otherwise is not reused)
            search=dict(trial='oom-under-limit', margin=self.margin,
                        steps=self.steps_per_trial,
                        init=self.init_batch_size, max=upper, adjust=self.adjust,
                        candidates=self.num_candidates, scan_limit=self.scan_limit))

    # ------------------------------------------------------- applying the batch size
    @staticmethod
    def _current(runner, world_size: int) -> Dict[str, int]:
        """Per-GPU batch, accumulation and effective batch the runner was built with."""
        loader = runner.train_dataloader
        batch = loader.batch_size
        if batch is None:  # a batch_sampler decides the batch size
            batch = getattr(loader.batch_sampler, 'batch_size', None)
        if batch is None:
            raise ValueError('AutoBatchSizeHook: cannot read the train dataloader\'s '
                             'batch size; set train_dataloader.batch_size.')
        accumulation = optim_accumulation(runner.optim_wrapper)
        return dict(batch=batch, accumulation=accumulation,
                    total=batch * world_size * accumulation)

    def _upper_bound(self, runner, current: Dict[str, int], world_size: int) -> int:
        """Largest batch worth trying; checks the setting can be changed at all."""
        from ..config.scaling_recipe import recorded_plan
        if runner.cfg.get('train_dataloader') is None or \
                runner.cfg.get('optim_wrapper') is None:
            raise ValueError('AutoBatchSizeHook needs a Runner built from a config '
                             '(Runner.from_cfg) with train_dataloader and optim_wrapper.')
        if recorded_plan(runner.cfg) is None and current['accumulation'] > 1:
            raise ValueError(
                f'AutoBatchSizeHook: the config accumulates gradients over '
                f'{current["accumulation"]} steps without a scaling recipe, so its '
                'iteration counts are micro-steps that a new accumulation would change. '
                'State the effective batch with scaling = dict(total_batch_size='
                f'{current["total"]}) and remove the accumulation setting.')
        scaling = runner.cfg.get('scaling') or {}
        fixed = scaling.get('per_gpu_batch_size')
        if fixed not in (None, 'auto'):
            raise ValueError(
                f'AutoBatchSizeHook chooses the per-GPU batch, but scaling.'
                f'per_gpu_batch_size={fixed!r} fixes it: set it to \'auto\' (or remove '
                'it), or remove the hook.')
        if self.adjust == 'accumulation':
            total = scaling.get('total_batch_size', current['total'])
            upper = total // world_size  # a larger per-GPU batch could not be used
        else:
            upper = 256
        if self.max_batch_size is not None:
            upper = min(upper, self.max_batch_size)
        if scaling.get('max_per_gpu_batch_size') is not None:
            upper = min(upper, scaling['max_per_gpu_batch_size'])
        return max(upper, 1)

    def _make_plan(self, runner, current: Dict[str, int], found: int, world_size: int):
        from ..config.scaling_recipe import make_plan, recorded_plan
        scaling = runner.cfg.get('scaling') or {}
        recorded = recorded_plan(runner.cfg)
        if self.adjust == 'accumulation':
            total = scaling.get('total_batch_size', current['total'])
            base = scaling.get('base_batch_size',
                               recorded.base_batch if recorded else None)
            rule = scaling.get('lr_scaling', recorded.lr_scaling if recorded else 'none')
            return make_plan(total, world_size, max_per_gpu_batch=found,
                             base_batch_size=base, lr_scaling=rule)
        base = scaling.get('base_batch_size', scaling.get('total_batch_size',
                                                          current['total']))
        return make_plan(found * world_size, world_size, per_gpu_batch=found,
                         base_batch_size=base, lr_scaling=self.lr_scaling)

    def _apply(self, runner, current: Dict[str, int], found: int, world_size: int) -> None:
        """Make the built runner train with the plan for ``found`` per-GPU samples."""
        self.plan = self._make_plan(runner, current, found, world_size)
        require_scaling_runner(runner, 'AutoBatchSizeHook').apply_plan(
            self.plan, 'auto batch size')
