"""Starting N test ranks on whatever this machine has: no GPU, fewer GPUs than ranks, or
one GPU a rank.

mmengine gives rank ``r`` the device ``cuda:LOCAL_RANK`` (and its logger reads
``CUDA_VISIBLE_DEVICES[local_rank]``), so two ranks on a one-GPU machine die with an
IndexError or "invalid device ordinal". Where CUDA is visible but there are fewer GPUs
than ranks, the ranks run on the CPU (gloo) instead: CUDA is hidden from the children
(``CUDA_VISIBLE_DEVICES=''``), which are spawned so that they read that setting (a forked
child would inherit the parent's CUDA state).
"""
import contextlib
import os
import subprocess
import sys
from typing import Callable, Iterator, Optional, Sequence

import torch
import torch.multiprocessing as mp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository


def visible_gpus() -> int:
    """CUDA devices this process sees (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def ranks_on_cpu(nprocs: int, cpu_only: bool = False) -> bool:
    """Whether ``nprocs`` ranks must run with CUDA hidden (CUDA visible, too few GPUs)."""
    gpus = visible_gpus()
    return gpus > 0 and (cpu_only or gpus < nprocs)


@contextlib.contextmanager
def cuda_hidden_from_children(hide: bool = True) -> Iterator[None]:
    """``CUDA_VISIBLE_DEVICES=''`` in this process's environment while children start."""
    if not hide:
        yield
        return
    before = os.environ.get('CUDA_VISIBLE_DEVICES')
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    try:
        yield
    finally:
        if before is None:
            os.environ.pop('CUDA_VISIBLE_DEVICES', None)
        else:
            os.environ['CUDA_VISIBLE_DEVICES'] = before


def start_ranks(fn: Callable, args: Sequence, nprocs: int, cpu_only: bool = False) -> None:
    """``mp.start_processes(fn, args, nprocs)`` on the devices this machine allows.

    Args:
        fn (callable): ``fn(rank, *args)``, module-level (spawned children import it).
        args (sequence): the other arguments of ``fn``.
        nprocs (int): number of ranks.
        cpu_only (bool): the test is written for CPU (gloo) ranks: hide CUDA even when
            there is a GPU for every rank.

    Without CUDA the children are forked (they inherit the imported stack: seconds, not
    the half minute a spawned child spends importing mmdet3d).
    """
    if visible_gpus() == 0:
        mp.start_processes(fn, args=tuple(args), nprocs=nprocs, join=True,
                           start_method='fork')
        return
    with cuda_hidden_from_children(ranks_on_cpu(nprocs, cpu_only)):
        mp.start_processes(fn, args=tuple(args), nprocs=nprocs, join=True,
                           start_method='spawn')


def child_env(nprocs: int, env: Optional[dict] = None) -> dict:
    """``env`` (default ``os.environ``) for a launcher subprocess of ``nprocs`` ranks, with
    CUDA hidden where there are fewer GPUs than ranks."""
    env = dict(os.environ if env is None else env)
    if ranks_on_cpu(nprocs):
        env['CUDA_VISIBLE_DEVICES'] = ''
    return env


def run_torchrun(script: str, args: Sequence[str], nprocs: int, cwd: str,
                 timeout: float) -> subprocess.CompletedProcess:
    """``script args`` under ``torchrun --nproc_per_node=nprocs`` on free ports, with the
    repository importable, one intra-op thread a rank and CUDA hidden where there are
    fewer GPUs than ranks; output captured."""
    env = child_env(nprocs, dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS='1'))
    return subprocess.run(
        [sys.executable, '-m', 'torch.distributed.run', f'--nproc_per_node={nprocs}',
         '--master_port=0', '--rdzv_backend=c10d', '--rdzv_endpoint=localhost:0',
         str(script), *map(str, args)],
        capture_output=True, text=True, env=env, timeout=timeout, cwd=str(cwd))
