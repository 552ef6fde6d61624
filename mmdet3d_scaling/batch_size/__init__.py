"""The batch size search: the per-GPU batch chosen at the start of training, as the
largest that fits (the auto batch size) or as the fastest fit in a memory budget
(``scaling.memory_budget``: per-GPU batch x gradient checkpointing). One package a
feature: its config step, searches, trial frame, probes, cache and hooks.

What is where, in the order a value flows (config step -> hook -> search):

- :mod:`.config_step`: reads ``auto_batch_size``, ``scaling.per_gpu_batch_size='auto'``
  and ``scaling.memory_budget`` once and adds the hook with the resolved values
  (registered as a :func:`~mmdet3d_scaling.config.prepare_config` step on import).
- :mod:`.search_hook`: :class:`BatchSizeSearchHook`, what both hooks share;
  :mod:`.auto_batch_size_hook` (:class:`AutoBatchSizeHook`) and
  :mod:`.fastest_fit_hook` (:class:`FastestFitHook`), one hook a file.
- :mod:`.search`: the largest batch (:class:`BatchSizeFinder`, :class:`Trial`,
  :class:`SearchResult`); :mod:`.fastest_fit`: the fastest fit
  (:class:`FastestFitFinder`, its :class:`Variant` s, :class:`FitTrial`,
  :class:`FitResult`); :mod:`.checkpoint_switch`: checkpointing off and on again.
- :mod:`.trial`: the frame of every trial of both (:class:`TrialSearch`: the state
  restored, the memory limit, out-of-memory errors survived), the cross-rank minimum.
- :mod:`.samples`: the trial batches: the dataset's largest samples
  (:class:`LargestSampleBatches`, :func:`rank_largest`, :func:`sample_size`) or random
  ones (:class:`RandomSampleBatches`).
- :mod:`.cache`: results in a JSON file of the work dir, agreed across ranks.
- :mod:`.memory_probe`: device memory as a search reads it: the CUDA allocator
  (:class:`CudaMemoryProbe`) or a modelled device for CPU runs
  (:class:`ModeledMemoryProbe`, :class:`ModeledCheckpointingProbe`).

The library of ``tools/benchmark_auto_batch_size.py`` is
:mod:`mmdet3d_scaling.diagnostics.batch_size_benchmark` (above the hooks it uses).
"""
from .cache import ResultCache, cache_key, lookup_agreed
from .checkpoint_switch import CheckpointSwitch
from .config_step import configure_batch_size_search
from .fastest_fit import FastestFitFinder, FitResult, FitTrial, Variant, preference_order
from .memory_probe import (CudaMemoryProbe, MemoryProbe, ModeledCheckpointingProbe,
                           ModeledMemoryProbe)
from .samples import (LargestSampleBatches, RandomSampleBatches, rank_largest,
                      sample_size)
from .search import BatchSizeFinder, SearchResult, Trial
from .trial import TrainingState, TrialSearch, agree_min, is_out_of_memory
from .search_hook import BatchSizeSearchHook
from .auto_batch_size_hook import AutoBatchSizeHook
from .fastest_fit_hook import FastestFitHook

__all__ = [
    'configure_batch_size_search', 'BatchSizeSearchHook', 'AutoBatchSizeHook',
    'FastestFitHook', 'BatchSizeFinder', 'SearchResult', 'Trial', 'FastestFitFinder',
    'FitResult', 'FitTrial', 'Variant', 'preference_order', 'CheckpointSwitch',
    'TrialSearch', 'TrainingState', 'agree_min', 'is_out_of_memory',
    'LargestSampleBatches', 'RandomSampleBatches', 'rank_largest', 'sample_size',
    'ResultCache', 'cache_key', 'lookup_agreed', 'CudaMemoryProbe', 'MemoryProbe',
    'ModeledMemoryProbe', 'ModeledCheckpointingProbe'
]
