"""The shim tests compare each ``speed`` patch with upstream, so the set is applied here
(on import the plugin applies only ``fixes`` and ``cpu``) and reverted afterwards."""
import pytest

import mmdet3d_scaling  # noqa: F401
from mmdet3d_scaling.compat import patching


@pytest.fixture(autouse=True, scope='package')
def speed_patches():
    applied = patching.apply(['speed'])
    yield
    patching.revert(applied)
