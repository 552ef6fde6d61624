"""A cache of search results (both searches), so a resumed run does not search again.

Results live in one JSON file in the work dir, keyed by a hash of what decides the
result (:func:`cache_key`; the two searches' keys differ); :func:`lookup_agreed` reuses
an entry only when every rank has it.
"""
import hashlib
import json
import os
import os.path as osp
from typing import Any, Dict, Optional, Type, TypeVar, Union

from .fastest_fit import FitResult
from .search import SearchResult
from .trial import agree_min

Result = TypeVar('Result', SearchResult, FitResult)


def cache_key(parts: Dict[str, Any]) -> str:
    """A stable hash of what decides memory use (config parts, world size, device)."""
    text = json.dumps(parts, sort_keys=True, default=repr)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


class ResultCache:
    """Search results of one kind in one JSON file, keyed by :func:`cache_key`.

    Args:
        path: the JSON file (in the work dir, so a resumed run finds it).
        result_type: the kind of entries read back: :class:`~.search.SearchResult`
            (the auto batch size) or :class:`~.fastest_fit.FitResult` (the fastest
            fit). Defaults to :class:`~.search.SearchResult`.
    """

    def __init__(self, path: str, result_type: Type[Result] = SearchResult):
        self.path = path
        self.result_type = result_type

    def _read(self) -> dict:
        if not osp.isfile(self.path):
            return {}
        with open(self.path) as f:
            try:
                return json.load(f)
            except json.JSONDecodeError as exc:
                raise ValueError(f'batch size search cache {self.path} is not valid JSON '
                                 f'({exc}); delete it to search again.') from exc

    def get(self, key: str) -> Optional[Result]:
        entry = self._read().get(key)
        return None if entry is None else self.result_type.from_dict(entry)

    def put(self, key: str, result: Union[SearchResult, FitResult]) -> None:
        entries = self._read()
        entries[key] = result.to_dict()
        os.makedirs(osp.dirname(osp.abspath(self.path)), exist_ok=True)
        tmp = f'{self.path}.tmp'
        with open(tmp, 'w') as f:
            json.dump(entries, f, indent=2, sort_keys=True)
        os.replace(tmp, self.path)


def lookup_agreed(cache: ResultCache, key: str) -> Optional[Result]:
    """The cached result if every rank has it (the minimum batch among them), else None.

    All ranks must call this together; a rank without the entry makes everyone search.
    """
    result = cache.get(key)
    have = agree_min(1 if result is not None else 0)
    if not have:
        return None
    batch = agree_min(result.batch_size)
    result.batch_size = batch
    result.from_cache = True
    return result
