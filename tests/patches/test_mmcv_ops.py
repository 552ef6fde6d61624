import subprocess
import sys

import pytest

from mmdet3d_scaling.patches import mmcv_ops


def test_installed_mmcv_has_ops():
    mmcv_ops.check()  # the test environment is a working one


@pytest.mark.slow
def test_missing_ops_give_the_fix():
    # A fresh interpreter where mmcv._ext cannot be imported, as with mmcv-lite.
    code = ("import sys; sys.modules['mmcv._ext'] = None\n"
            "import mmdet3d_scaling\n")
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)
    assert proc.returncode != 0
    assert 'MissingMMCVOpsError' in proc.stderr
    assert 'has no compiled ops' in proc.stderr
    assert 'MMCV_WITH_OPS=1' in proc.stderr
