"""The search result cache: stable keys, a JSON round trip, a clear error on a broken
file. (Agreement across ranks is checked in test_search's 2-process run.)"""
import json

import pytest

from mmdet3d_scaling.batch_size.cache import ResultCache, cache_key, lookup_agreed
from mmdet3d_scaling.batch_size.search import SearchResult


def test_cache_roundtrip_and_key(tmp_path):
    cache = ResultCache(str(tmp_path / 'sub' / 'abs.json'))
    key = cache_key(dict(model={'a': 1}, world_size=2, device='X'))
    assert key == cache_key(dict(device='X', world_size=2, model={'a': 1}))
    assert key != cache_key(dict(model={'a': 1}, world_size=4, device='X'))
    assert cache.get(key) is None and lookup_agreed(cache, key) is None
    result = SearchResult(batch_size=6, local_batch_size=6, capacity_bytes=9, limit_bytes=8,
                          margin=0.1, max_batch_size=16, hit_upper_bound=False,
                          device_name='X', seconds=1.5)
    cache.put(key, result)
    again = lookup_agreed(cache, key)
    assert again.batch_size == 6 and again.from_cache
    assert json.load(open(cache.path))[key]['batch_size'] == 6
    with open(cache.path, 'w') as f:
        f.write('{broken')
    with pytest.raises(ValueError, match='delete it'):
        cache.get(key)
