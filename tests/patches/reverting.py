"""A reference run on upstream code inside a test: named patches reverted, then applied
again (each must be applied on entry, as the package's conftest leaves the sets)."""
import contextlib
from typing import Iterator, List

from mmdet3d_scaling.patches import patching


@contextlib.contextmanager
def reverted(names: List[str]) -> Iterator[None]:
    assert sorted(patching.revert(names)) == sorted(names)
    try:
        yield
    finally:
        assert sorted(patching.apply(names)) == sorted(names)
