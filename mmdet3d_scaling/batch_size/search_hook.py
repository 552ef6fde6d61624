"""BatchSizeSearchHook: what the two search hooks share (options, ``before_run``, the
probe, the cache, applying the plan). Not registered; :class:`~.auto_batch_size_hook.
AutoBatchSizeHook` and :class:`~.fastest_fit_hook.FastestFitHook` are.

Both run in ``before_run`` of training, i.e. after mmengine has built the train loop,
the optim wrapper and the parameter schedulers, and before weights are initialised, a
checkpoint is resumed and the optim wrapper's accumulation counters are initialised. So
the pieces the plan replaces (dataloader, loop length, schedulers, accumulation) are in
place before anything reads them, and a resumed checkpoint's scheduler state lands on
the schedulers built for the new batch size.
"""
import copy
import logging
import os.path as osp
from typing import Any, Callable, Dict, Optional, Type, Union

import torch
from mmengine import dist
from mmengine.hooks import Hook
from mmengine.logging import print_log

from ..config.scaling_plan import ScalingPlan, make_plan
from ..engine.optim_state import optim_wrappers
from ..engine.runner import require_scaling_runner
from ..utils.model import unwrap_model
from .cache import ResultCache, cache_key, lookup_agreed
from .memory_probe import CudaMemoryProbe, MemoryProbe, ModeledMemoryProbe
from .samples import LargestSampleBatches
from .search import SearchResult


class BatchSizeSearchHook(Hook):
    """Search before training, cache the result in the work dir, apply the plan.

    Needs ``runner_type='ScalingRunner'`` (the plan is applied with
    :meth:`~mmdet3d_scaling.engine.runner.ScalingRunner.apply_plan`). Priority
    ``HIGHEST``: its ``before_run`` runs before any hook reads the batch size or the
    loop length. The result is cached in the work dir, keyed by the model / dataset /
    optimizer config, world size, device and search settings, so a resumed run reuses
    it.

    Args:
        margin (float): share of the memory (the device's; the fastest fit's: the
            budget's) kept free in the trials, in [0, 1). Defaults to 0.1.
        num_candidates (int): distinct large samples used to build trial batches.
            Defaults to 16.
        scan_limit (int): data infos scanned to find them. Defaults to 1000.
        cache_file (str): JSON file for results, relative to the work dir. Defaults to
            'auto_batch_size.json'.
        use_cache (bool): reuse a cached result for the same setting. Defaults to True.
        probe (dict | MemoryProbe, optional): memory probe: None (the CUDA device;
            without one the hook warns and keeps the configured batch), a probe object,
            or a dict ``type='ModeledMemoryProbe'`` (the fastest fit also
            ``'ModeledCheckpointingProbe'``) with its arguments, for a modelled device
            (CPU dry runs and tests). Defaults to None.
        recipe (dict, optional): the scaling recipe's batch settings the search keeps
            (``total_batch_size``, ``base_batch_size``, ``lr_scaling``,
            ``per_gpu_batch_size``, ``max_per_gpu_batch_size``), filled in from
            ``scaling`` by the config step (:mod:`~.config_step`); leave it unset.
            Defaults to None (no recipe).
    """

    priority = 'HIGHEST'  # before any hook reads the batch size or the loop length
    log_name = 'batch size search'  # how the log lines start
    result_type: Type = SearchResult
    probe_types: Dict[str, Type] = {'ModeledMemoryProbe': ModeledMemoryProbe}

    def __init__(self, margin: float = 0.1, num_candidates: int = 16,
                 scan_limit: int = 1000, cache_file: str = 'auto_batch_size.json',
                 use_cache: bool = True, probe: Union[None, dict, MemoryProbe] = None,
                 recipe: Optional[Dict[str, Any]] = None):
        if not 0 <= margin < 1:
            raise ValueError(f'{type(self).__name__}: margin must be in [0, 1), got '
                             f'{margin}')
        self.margin = margin
        self.num_candidates = num_candidates
        self.scan_limit = scan_limit
        self.cache_file = cache_file
        self.use_cache = use_cache
        self.probe = probe
        self.recipe = None if recipe is None else dict(recipe)
        self.result: Any = None
        self.plan: Optional[ScalingPlan] = None
        self.cache_path: Optional[str] = None
        self._done = False

    # ------------------------------------------------------------------ entry point
    def before_run(self, runner) -> None:
        """Search (or take the result from the cache) and apply the plan, once, before
        training; nothing for ``runner.val()`` / ``test()``."""
        name = type(self).__name__
        # before_run also fires for runner.val()/test(); act once, when training.
        if self._done or not require_scaling_runner(runner, name).train_loop_built:
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
        raise NotImplementedError

    # ------------------------------------------------------------ shared by both
    def _build_probe(self, model, optim_wrapper) -> Optional[MemoryProbe]:
        name = type(self).__name__
        if isinstance(self.probe, dict):
            cfg = dict(self.probe)
            kind = cfg.pop('type', 'ModeledMemoryProbe')
            if kind not in self.probe_types:
                raise ValueError(f'{name}: probe type {kind!r} unknown; a dict probe '
                                 f'must be one of {sorted(self.probe_types)}')
            optimizers = [w.optimizer for w in optim_wrappers(optim_wrapper)]
            return self.probe_types[kind](model, optimizers=optimizers, **cfg)
        if self.probe is not None:
            return self.probe
        if not torch.cuda.is_available():
            print_log(f'{name}: no CUDA device, so no memory to fit: keeping the '
                      "configured batch. (Pass probe=dict(type='ModeledMemoryProbe', "
                      'capacity_bytes=...) for a dry run.)', logger='current',
                      level=logging.WARNING)
            return None
        return CudaMemoryProbe()

    def _batches(self, runner) -> LargestSampleBatches:
        loader = runner.train_dataloader
        return LargestSampleBatches(loader.dataset, loader.collate_fn,
                                    num_candidates=self.num_candidates,
                                    scan_limit=self.scan_limit)

    def _cached_or_search(self, runner, model, probe: MemoryProbe,
                          search: Dict[str, Any], run: Callable[[], Any]) -> Any:
        """The cached result for this setting (every rank has it), else ``run()``,
        which rank 0 caches. ``search``: the search settings of the cache key."""
        key = cache_key(self._key_parts(runner, model, probe, search))
        cache = ResultCache(osp.join(runner.work_dir, self.cache_file), self.result_type)
        self.cache_path = cache.path
        result = lookup_agreed(cache, key) if self.use_cache else None
        if result is None:
            result = run()
            if dist.is_main_process():
                cache.put(key, result)
        return result

    @staticmethod
    def _key_parts(runner, model, probe: MemoryProbe,
                   search: Dict[str, Any]) -> Dict[str, Any]:
        """What decides the result: model, data, optimizer and precision, devices and
        the search settings. The config is read for the run's identity only."""
        cfg = runner.cfg
        optim_cfg = copy.deepcopy(cfg.get('optim_wrapper') or {})
        optim_cfg.pop('accumulative_counts', None)  # set from the result
        if isinstance(optim_cfg.get('optimizer'), dict):
            optim_cfg['optimizer'].pop('lr', None)  # scaled with the plan
        dataset = runner.train_dataloader.dataset
        world_size = dist.get_world_size()
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
            torch=torch.__version__, search=search)

    def _recipe_plan(self, world_size: int, **batch) -> ScalingPlan:
        """The recipe's plan with ``batch`` (``per_gpu_batch`` or
        ``max_per_gpu_batch``) found by the search."""
        recipe = self.recipe
        return make_plan(recipe['total_batch_size'], world_size,
                         base_batch_size=recipe['base_batch_size'],
                         lr_scaling=recipe['lr_scaling'], **batch)

    def _apply(self, runner, plan: ScalingPlan) -> None:
        """Make the built runner train with ``plan``."""
        self.plan = plan
        runner.apply_plan(plan, self.log_name)
