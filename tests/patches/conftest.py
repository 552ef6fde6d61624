"""The patch tests compare each ``speed`` patch with upstream, on CPU and (where there is
one) CUDA tensors, so the set is applied here (on import the plugin applies only
``fixes``, and ``cpu`` without CUDA) and reverted afterwards. ``point_ops_cpu`` is named
on its own so that the CPU cases run on a CUDA machine too; it goes first, as on import,
so that ``grouping_backward`` wraps its dispatcher."""
import pytest

import mmdet3d_scaling  # noqa: F401
from mmdet3d_scaling.patches import patching


@pytest.fixture(autouse=True, scope='package')
def speed_patches():
    applied = patching.apply(['point_ops_cpu'])
    applied += patching.apply(['speed'])
    yield
    patching.revert(applied)
