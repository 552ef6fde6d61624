"""Automatic per-device batch size: the search and the memory it reads."""
from .memory_probe import CudaMemoryProbe, MemoryProbe, ModeledMemoryProbe
from .search import BatchSizeFinder, SearchResult, Trial

__all__ = ['BatchSizeFinder', 'SearchResult', 'Trial', 'CudaMemoryProbe',
           'MemoryProbe', 'ModeledMemoryProbe']
