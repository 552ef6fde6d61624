"""AutoBatchSizeHook: train with the largest per-GPU batch that fits, same effective batch.

Runs in ``before_run`` of training, as every search hook
(:class:`~.search_hook.BatchSizeSearchHook` says why there).
"""
from typing import Dict, Optional

from mmengine import dist

from mmdet3d.registry import HOOKS

from ..config.scaling_plan import ScalingPlan, make_plan
from ..engine.optim_state import accumulation as optim_accumulation
from ..registry import register
from .memory_probe import MemoryProbe
from .search import BatchSizeFinder, SearchResult
from .search_hook import BatchSizeSearchHook

ADJUST_MODES = ('accumulation', 'lr')


@register(HOOKS)
class AutoBatchSizeHook(BatchSizeSearchHook):
    """Search the largest per-GPU batch before training and keep the effective batch.

    The search (:class:`~mmdet3d_scaling.batch_size.search.BatchSizeFinder`)
    trains a few real steps on batches of the dataset's largest samples, doubling then
    bisecting the batch, each trial with the device limited to ``1 - margin`` of its
    memory, so ``margin`` of device memory stays free. All ranks use the
    smallest batch any of them found; the result is cached in the work dir.

    Then, with ``adjust='accumulation'`` (default), the per-GPU batch and the gradient
    accumulation are set so that per-GPU batch x world size x accumulation equals the
    effective batch the run was configured with (the per-GPU batch is the largest that
    fits and divides it). With ``adjust='lr'`` there is no accumulation: the effective
    batch becomes per-GPU batch x world size and the learning rate is scaled by the ratio
    of the new to the configured effective batch (``lr_scaling`` rule).

    Turned on by ``scaling.per_gpu_batch_size='auto'`` or ``auto_batch_size = dict(...)``
    (its options), or put in ``custom_hooks``. Needs ``runner_type='ScalingRunner'``;
    priority ``HIGHEST`` (:class:`~.search_hook.BatchSizeSearchHook`).

    Args:
        steps_per_trial (int): training steps per trial. Defaults to 2.
        init_batch_size (int): first per-GPU batch tried (samples). Defaults to 1.
        max_batch_size (int, optional): largest per-GPU batch tried (samples). Defaults
            to None: the configured effective batch / world size with
            ``adjust='accumulation'`` (a larger batch could not be used), else 256; at
            most ``scaling.max_per_gpu_batch_size`` either way.
        adjust (str): 'accumulation' (keep the effective batch) or 'lr' (scale the LR).
            Defaults to 'accumulation'.
        lr_scaling (str): with ``adjust='lr'``: 'linear' or 'sqrt'. Defaults to
            'linear'.
        **kwargs: the options of every search hook
            (:class:`~.search_hook.BatchSizeSearchHook`): ``margin`` (share of device
            memory kept free), ``num_candidates``, ``scan_limit``, ``cache_file``,
            ``use_cache``, ``probe``, ``recipe``.
    """

    log_name = 'auto batch size'

    def __init__(self, steps_per_trial: int = 2, init_batch_size: int = 1,
                 max_batch_size: Optional[int] = None, adjust: str = 'accumulation',
                 lr_scaling: str = 'linear', **kwargs):
        super().__init__(**kwargs)
        if adjust not in ADJUST_MODES:
            raise ValueError(f'AutoBatchSizeHook: adjust={adjust!r} is not one of '
                             f'{ADJUST_MODES}')
        if lr_scaling not in ('linear', 'sqrt'):
            raise ValueError(f"AutoBatchSizeHook: lr_scaling={lr_scaling!r}: use 'linear' "
                             "or 'sqrt' (adjust='accumulation' keeps the LR as it is)")
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f'AutoBatchSizeHook: max_batch_size must be >= 1, got '
                             f'{max_batch_size}')
        self.steps_per_trial = steps_per_trial
        self.init_batch_size = init_batch_size
        self.max_batch_size = max_batch_size
        self.adjust = adjust
        self.lr_scaling = lr_scaling

    def _find_and_apply(self, runner, model, probe: MemoryProbe) -> None:
        world_size = dist.get_world_size()
        current = self._current(runner, world_size)
        upper = self._upper_bound(current, world_size)
        # trial: how a trial is judged (a result judged otherwise is not reused)
        search = dict(trial='oom-under-limit', margin=self.margin,
                      steps=self.steps_per_trial, init=self.init_batch_size, max=upper,
                      adjust=self.adjust, candidates=self.num_candidates,
                      scan_limit=self.scan_limit)
        result = self._cached_or_search(
            runner, model, probe, search,
            lambda: self._search(runner, model, probe, upper))
        if result.from_cache:
            runner.logger.info(f'auto batch size: per-GPU batch {result.batch_size} '
                               f'from the cache {self.cache_path} (no search).')
        self.result = result
        self._apply(runner, self._make_plan(current, result.batch_size, world_size))

    def _search(self, runner, model, probe: MemoryProbe, upper: int) -> SearchResult:
        finder = BatchSizeFinder(
            model, runner.optim_wrapper, self._batches(runner), probe,
            margin=self.margin, steps_per_trial=self.steps_per_trial,
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

    def _total(self, current: Dict[str, int]) -> int:
        """The effective batch to keep: the recipe's, else the one built."""
        return self.recipe['total_batch_size'] if self.recipe else current['total']

    def _upper_bound(self, current: Dict[str, int], world_size: int) -> int:
        """Largest batch worth trying; checks the setting can be changed at all."""
        if self.recipe is None and current['accumulation'] > 1:
            raise ValueError(
                f'AutoBatchSizeHook: the config accumulates gradients over '
                f'{current["accumulation"]} steps without a scaling recipe, so its '
                'iteration counts are micro-steps that a new accumulation would change. '
                'State the effective batch with scaling = dict(total_batch_size='
                f'{current["total"]}) and remove the accumulation setting.')
        if self.adjust == 'accumulation':
            upper = self._total(current) // world_size  # a larger one could not be used
        else:
            upper = 256
        caps = (self.max_batch_size, (self.recipe or {}).get('max_per_gpu_batch_size'))
        return max(min([upper] + [c for c in caps if c is not None]), 1)

    def _make_plan(self, current: Dict[str, int], found: int,
                   world_size: int) -> ScalingPlan:
        if self.adjust == 'accumulation':
            if self.recipe is not None:
                return self._recipe_plan(world_size, max_per_gpu_batch=found)
            return make_plan(current['total'], world_size, max_per_gpu_batch=found,
                             lr_scaling='none')
        base = (self.recipe or {}).get('base_batch_size') or self._total(current)
        return make_plan(found * world_size, world_size, per_gpu_batch=found,
                         base_batch_size=base, lr_scaling=self.lr_scaling)
