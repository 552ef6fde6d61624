"""patches/cpu/dist_cpu: mmengine's init_dist on a CPU-only torch (multi-rank use is covered
by tests/parallel/test_ddp_runner.py, whose Runners start their groups this way).
"""
import multiprocessing as mp
import os

import pytest
import torch

import mmdet3d_scaling  # noqa: F401
from mmdet3d_scaling.patches.cpu import dist_cpu
from mmdet3d_scaling.patches import patching
from tests.parallel.dist_parts import free_port

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason='the patch is for CPU-only torch')


def _init_one_rank(port: int, queue) -> None:
    os.environ.update(RANK='0', LOCAL_RANK='0', WORLD_SIZE='1', MASTER_ADDR='127.0.0.1',
                      MASTER_PORT=str(port))
    from mmengine.dist import get_world_size, init_dist
    init_dist('pytorch', backend='gloo')
    t = torch.ones(1)
    torch.distributed.all_reduce(t)
    queue.put((get_world_size(), t.item()))
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_init_dist_pytorch_starts_a_gloo_group_without_cuda():
    ctx = mp.get_context('fork')
    queue = ctx.Queue()
    proc = ctx.Process(target=_init_one_rank, args=(free_port(), queue))
    proc.start()
    proc.join(120)
    assert proc.exitcode == 0
    assert queue.get(timeout=5) == (1, 1.0)


def test_apply_is_idempotent_and_keeps_set_device():
    from mmengine.dist import utils
    assert patching.apply(['dist_cpu']) == []  # applied on import, once
    assert all(getattr(getattr(utils, n), '_mmdet3d_scaling_wrapped', False)
               for n in ('_init_dist_pytorch', '_init_dist_mpi', '_init_dist_slurm'))
    assert torch.cuda.set_device.__module__ == 'torch.cuda'  # restored after use
