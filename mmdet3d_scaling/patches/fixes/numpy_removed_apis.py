"""numpy >= 2.5: names that upstream code still calls.

numpy 2.5 removed ``np.row_stack`` (deprecated since 2.0 as an alias of ``np.vstack``).
The KITTI evaluation path that mmdet3d 1.4.0 runs after training (its numba-compiled
overlap code) still reaches it, so a stock PV-RCNN run on numpy 2.5 trained to the end
and then crashed at its final validation. Where numpy lacks the name, the patch puts the
alias back; it does nothing on an older numpy. The plugin's own code does not use it.
"""
from typing import List

import numpy as np

from ..patching import Change, Patch, declare

UPSTREAM = ('numpy>=2.5', 'mmdet3d==1.4.0')


def _changes() -> List[Change]:
    return [Change(np, 'row_stack', np.vstack)]


PATCH = declare(Patch(
    name='numpy_removed_apis', kind='fixes', targets=('numpy.row_stack',),
    upstream=UPSTREAM, changes=_changes, needed=lambda: not hasattr(np, 'row_stack'),
    why="np.row_stack, removed in numpy 2.5, is still called on mmdet3d's KITTI "
        'evaluation path: restored as the alias of np.vstack it was'))
