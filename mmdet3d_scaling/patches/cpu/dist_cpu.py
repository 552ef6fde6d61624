"""mmengine 0.10.x on CPU-only torch: ``init_dist`` cannot start a process group.

mmengine's ``_init_dist_pytorch`` / ``_init_dist_mpi`` / ``_init_dist_slurm`` call
``torch.cuda.set_device(local_rank)`` before ``init_process_group``, whatever the backend;
on a CPU-only torch build that raises (``torch._C`` has no ``_cuda_setDevice``), so a
gloo run started by torchrun, srun or mpirun dies before its first collective. Without
CUDA the launch functions run with ``set_device`` as a no-op (there is no device to
choose); with CUDA nothing changes.
"""
import functools
from typing import Callable, List

from ..patching import Change, Patch, declare

UPSTREAM = 'mmengine>=0.10,<0.11'
_LAUNCH_FUNCTIONS = ('_init_dist_pytorch', '_init_dist_mpi', '_init_dist_slurm')


def _without_set_device(launch: Callable) -> Callable:

    @functools.wraps(launch)
    def wrapper(*args, **kwargs):
        import torch
        original = torch.cuda.set_device
        torch.cuda.set_device = lambda device: None
        try:
            return launch(*args, **kwargs)
        finally:
            torch.cuda.set_device = original

    wrapper._mmdet3d_scaling_wrapped = True
    return wrapper


def _changes() -> List[Change]:
    from mmengine.dist import utils
    return [Change(utils, name, _without_set_device(getattr(utils, name)))
            for name in _LAUNCH_FUNCTIONS]


PATCH = declare(Patch(
    name='dist_cpu', kind='cpu',
    targets=tuple(f'mmengine.dist.utils.{name}' for name in _LAUNCH_FUNCTIONS),
    upstream=UPSTREAM, changes=_changes,
    why='init_dist calls torch.cuda.set_device: gloo runs under torchrun / srun / '
        'mpirun die at start on a CPU-only torch'))
