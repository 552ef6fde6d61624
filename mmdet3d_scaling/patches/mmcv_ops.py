"""mmcv 2.x without compiled ops: fail at import with the fix, not deep in mmdet3d.

``pip install mmcv`` of a version without a matching wheel, or ``mmcv-lite``, gives an
mmcv whose ``mmcv._ext`` extension is missing. mmdet3d then fails on some later import
with "No module named 'mmcv._ext'", which does not say what to do.
"""
import importlib

UPSTREAM = 'mmcv 2.x'

FIX = ('install mmcv 2.1.0 with its ops: `bash tools/ensure_env.sh` builds it (about '
       '11 min on 2 cores, cached afterwards), or by hand `pip install "setuptools<70" '
       '&& MMCV_WITH_OPS=1 pip install --no-build-isolation mmcv==2.1.0` (torch must be '
       'installed first), or a prebuilt wheel matching your torch/CUDA from OpenMMLab.')


class MissingMMCVOpsError(ImportError):
    """mmcv is installed without its compiled extension."""


def check() -> None:
    """Raise :class:`MissingMMCVOpsError` if mmcv's compiled ops cannot be imported."""
    try:
        mmcv = importlib.import_module('mmcv')
    except ImportError as err:
        raise MissingMMCVOpsError(f'mmcv is not installed; {FIX}') from err
    try:
        importlib.import_module('mmcv._ext')
    except ImportError as err:
        raise MissingMMCVOpsError(
            f'mmcv {mmcv.__version__} at {mmcv.__file__} has no compiled ops '
            f'(mmcv._ext: {err}); mmdet3d needs them. Fix: {FIX}') from err

