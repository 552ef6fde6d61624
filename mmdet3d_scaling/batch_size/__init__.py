"""Automatic per-device batch size: find the largest batch that trains in memory.

What is where:

- :mod:`.search`: the search (:class:`BatchSizeFinder`, its :class:`Trial` and
  :class:`SearchResult`), the state snapshot every trial restores
  (:class:`TrainingState`), out-of-memory detection and the cross-rank minimum.
- :mod:`.samples`: the trial batches: the dataset's largest samples
  (:class:`LargestSampleBatches`, :func:`rank_largest`, :func:`sample_size`) or random
  ones (:class:`RandomSampleBatches`).
- :mod:`.cache`: search results in a JSON file of the work dir, agreed across ranks.
- :mod:`.memory_probe`: device memory as the search reads it: the CUDA allocator
  (:class:`CudaMemoryProbe`) or a modelled device for CPU runs
  (:class:`ModeledMemoryProbe`).
- :mod:`.arrangements`: the fastest fit's trials (per-GPU batch x gradient
  checkpointing in a memory budget).

The library of ``tools/benchmark_auto_batch_size.py`` is
:mod:`mmdet3d_scaling.diagnostics.batch_size_benchmark` (above the hooks it uses).
"""
from .cache import ResultCache, cache_key, lookup_agreed
from .memory_probe import CudaMemoryProbe, MemoryProbe, ModeledMemoryProbe
from .samples import (LargestSampleBatches, RandomSampleBatches, rank_largest,
                      sample_size)
from .search import (BatchSizeFinder, SearchResult, TrainingState, Trial, agree_min,
                     is_out_of_memory, optim_wrappers)

__all__ = [
    'BatchSizeFinder', 'SearchResult', 'Trial', 'TrainingState', 'agree_min',
    'is_out_of_memory', 'optim_wrappers', 'LargestSampleBatches', 'RandomSampleBatches',
    'rank_largest', 'sample_size', 'ResultCache', 'cache_key', 'lookup_agreed',
    'CudaMemoryProbe', 'MemoryProbe', 'ModeledMemoryProbe'
]
