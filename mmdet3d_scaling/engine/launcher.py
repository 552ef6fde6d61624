"""Which job launcher started this process: torchrun, Slurm, MPI, or none."""
import os
from typing import Any, Mapping, Optional

LAUNCHERS = ('none', 'pytorch', 'slurm', 'mpi')
CHOICES = LAUNCHERS + ('auto',)


def detect_launcher(environ: Optional[Mapping[str, str]] = None) -> str:
    """Guess the launcher from the environment a launcher leaves behind.

    torchrun (and ``torch.distributed.launch``) set ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``;
    ``srun`` sets ``SLURM_PROCID``/``SLURM_NTASKS``; Open MPI and MPICH/Intel MPI set
    ``OMPI_COMM_WORLD_SIZE`` / ``PMI_SIZE``. A single task under ``salloc`` or ``mpirun
    -n 1`` counts as no launcher: there is nothing to synchronise with.
    """
    env = os.environ if environ is None else environ
    if all(k in env for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK')):
        return 'pytorch'
    if 'SLURM_PROCID' in env and int(env.get('SLURM_NTASKS', '1')) > 1:
        return 'slurm'
    if int(env.get('OMPI_COMM_WORLD_SIZE', env.get('PMI_SIZE', '1'))) > 1:
        return 'mpi'
    return 'none'


def resolve_launcher(requested: Optional[str],
                     environ: Optional[Mapping[str, str]] = None) -> str:
    """Turn ``--launcher`` into one of :data:`LAUNCHERS`; ``auto`` detects."""
    requested = requested or 'none'
    if requested not in CHOICES:
        raise ValueError(
            f'unknown launcher {requested!r}: use one of {", ".join(CHOICES)} '
            "('auto' detects torchrun, Slurm and MPI from the environment).")
    return detect_launcher(environ) if requested == 'auto' else requested


def world_size(launcher: str, environ: Optional[Mapping[str, str]] = None) -> int:
    """Number of processes the launcher will start (1 for ``none``)."""
    env = os.environ if environ is None else environ
    if launcher == 'pytorch':
        return int(env.get('WORLD_SIZE', '1'))
    if launcher == 'slurm':
        return int(env.get('SLURM_NTASKS', '1'))
    if launcher == 'mpi':
        return int(env.get('OMPI_COMM_WORLD_SIZE', env.get('PMI_SIZE', '1')))
    return 1


def shutdown_distributed(runner: Optional[Any] = None) -> None:
    """Destroy the process group explicitly at the end of a run.

    A gloo group left to the interpreter's exit handlers can abort a rank ("terminate
    called without an active exception") after the run finished, failing the launch.
    The DDP wrapper's reducer holds the group too, so ``runner`` (when given) keeps its
    trained module and drops the wrapper first.
    """
    import gc

    import torch.distributed as dist
    from mmengine.model import is_model_wrapper
    if runner is not None and is_model_wrapper(runner.model):
        runner.model = runner.model.module
        gc.collect()
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
