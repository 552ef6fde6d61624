"""Which job launcher started this process: torchrun, Slurm, MPI, or none.

Two checks keep a launch from silently going wrong (:func:`check_launch`):

- ``--launcher none`` (the default) inside a multi-process launch stops: every process
  would train alone in the same work dir, overwriting the others' checkpoints. We stop
  rather than switch to the launcher found, because the launcher changes the plan (the
  scaling recipe divides the total batch by the world size) and a user who forgot the
  flag should see that, not get a different run than the command line says.
- an explicit ``--launcher pytorch|slurm|mpi`` without the variables that launcher sets
  stops with their names before any process-group wait (mmengine would raise a bare
  ``KeyError: 'RANK'``, or wait up to the rendezvous timeout for ranks that do not exist).

Slurm counts only inside a real job step with ranks (``srun``): an ``sbatch`` script's
batch step or an ``salloc`` shell also carries ``SLURM_JOB_ID`` / ``SLURM_NTASKS``, but
no other task will ever join it.
"""
import os
from typing import Any, List, Mapping, Optional, Tuple

LAUNCHERS = ('none', 'pytorch', 'slurm', 'mpi')
CHOICES = LAUNCHERS + ('auto',)

#: what mmengine's ``init_dist`` reads for each launcher (see mmengine/dist/utils.py)
REQUIRED = {
    'pytorch': ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT'),
    'slurm': ('SLURM_PROCID', 'SLURM_NTASKS', 'SLURM_NODELIST'),
    'mpi': ('OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_SIZE', 'OMPI_COMM_WORLD_LOCAL_RANK',
            'MASTER_ADDR'),
}
HOW_TO_START = {
    'pytorch': 'torchrun --nproc_per_node=N tools/train.py CONFIG --launcher pytorch '
               '(or: bash tools/dist_train.sh CONFIG N)',
    'slurm': 'srun --ntasks=N ... python tools/train.py CONFIG --launcher slurm '
             '(or: bash tools/slurm_train.sh PARTITION JOB CONFIG WORK_DIR)',
    'mpi': 'mpirun -np N -x MASTER_ADDR=HOST python tools/train.py CONFIG --launcher mpi '
           '(Open MPI)',
}
# Slurm's special step ids (slurm.h): batch script, extern, interactive and pending steps
_SPECIAL_STEP_IDS = {0xFFFFFFFE, 0xFFFFFFFD, 0xFFFFFFFC, 0xFFFFFFFB, 0xFFFFFFFA}


class LaunchEnvironmentError(RuntimeError):
    """The launcher asked for and the environment the process runs in disagree."""


def _int(env: Mapping[str, str], key: str, default: int = 1) -> int:
    try:
        return int(env.get(key, default))
    except ValueError:
        return default


def slurm_step_tasks(env: Mapping[str, str]) -> int:
    """Tasks of the ``srun`` job step this process belongs to; 0 outside a real step.

    A step started by ``srun`` sets ``SLURM_STEP_ID`` (older Slurm: ``SLURM_STEPID``) to a
    small number and ``SLURM_PROCID``; the batch script of ``sbatch`` and the shell of
    ``salloc`` have no such step (or a special id), whatever ``SLURM_NTASKS`` says.
    """
    step = env.get('SLURM_STEP_ID', env.get('SLURM_STEPID'))
    if step is None or 'SLURM_PROCID' not in env:
        return 0
    try:
        if int(step) in _SPECIAL_STEP_IDS or int(step) < 0:
            return 0
    except ValueError:
        return 0
    return _int(env, 'SLURM_STEP_NUM_TASKS', _int(env, 'SLURM_NTASKS', 1))


def _mpi_size(env: Mapping[str, str]) -> int:
    return _int(env, 'OMPI_COMM_WORLD_SIZE', _int(env, 'PMI_SIZE', 1))


def found_launch(environ: Optional[Mapping[str, str]] = None
                 ) -> Optional[Tuple[str, str]]:
    """``(launcher, description)`` of a multi-process launch around this process, if any.

    Only launches with more than one process count: torchrun with ``WORLD_SIZE=1``,
    ``srun -n 1`` or ``mpirun -n 1`` run a single process, which needs no launcher.
    """
    env = os.environ if environ is None else environ
    if all(k in env for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK')) \
            and _int(env, 'WORLD_SIZE') > 1:
        return 'pytorch', (f"torchrun (RANK={env['RANK']}, WORLD_SIZE={env['WORLD_SIZE']}, "
                           f"LOCAL_RANK={env['LOCAL_RANK']})")
    tasks = slurm_step_tasks(env)
    if tasks > 1:
        step = env.get('SLURM_STEP_ID', env.get('SLURM_STEPID'))
        return 'slurm', (f"a Slurm job step (srun: SLURM_STEP_ID={step}, "
                         f"SLURM_PROCID={env['SLURM_PROCID']}, {tasks} tasks)")
    if _mpi_size(env) > 1:
        key = 'OMPI_COMM_WORLD_SIZE' if 'OMPI_COMM_WORLD_SIZE' in env else 'PMI_SIZE'
        return 'mpi', f'mpirun ({key}={env[key]})'
    return None


def detect_launcher(environ: Optional[Mapping[str, str]] = None) -> str:
    """Guess the launcher from the environment a launcher leaves behind.

    torchrun (and ``torch.distributed.launch``) set ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``
    (a world of one still counts: torchrun also set its rendezvous); ``srun`` sets a job
    step (``SLURM_STEP_ID``, ``SLURM_PROCID``); Open MPI and MPICH/Intel MPI set
    ``OMPI_COMM_WORLD_SIZE`` / ``PMI_SIZE``. An ``sbatch`` batch script, an ``salloc``
    shell, ``srun -n 1`` or ``mpirun -n 1`` count as no launcher: there is nothing to
    synchronise with.
    """
    env = os.environ if environ is None else environ
    if all(k in env for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK')):
        return 'pytorch'
    if slurm_step_tasks(env) > 1:
        return 'slurm'
    if _mpi_size(env) > 1:
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


def missing_variables(launcher: str, environ: Optional[Mapping[str, str]] = None
                      ) -> List[str]:
    """The variables ``launcher``'s process-group setup needs that are not set."""
    env = os.environ if environ is None else environ
    missing = [key for key in REQUIRED.get(launcher, ()) if key not in env]
    if launcher == 'slurm' and not missing and _int(env, 'SLURM_NTASKS') > 1 \
            and not slurm_step_tasks(env):
        # sbatch's batch step / salloc's shell: SLURM_NTASKS counts tasks no srun started
        missing.append('SLURM_STEP_ID (a job step started by srun)')
    return missing


def check_launch(requested: Optional[str], resolved: str,
                 environ: Optional[Mapping[str, str]] = None) -> None:
    """Stop a launch that would duplicate the run or wait for ranks that do not exist.

    Args:
        requested (str, optional): ``--launcher`` as given (``None`` = ``'none'``).
        resolved (str): what :func:`resolve_launcher` made of it.
        environ (Mapping, optional): the environment; ``os.environ`` by default.

    Raises:
        LaunchEnvironmentError: ``--launcher none`` inside a multi-process launch, or
            ``resolved`` needs variables that are not set.
    """
    env = os.environ if environ is None else environ
    if resolved == 'none':
        found = found_launch(env)
        if found is not None:
            launcher, description = found
            raise LaunchEnvironmentError(
                f'this process runs under {description} but --launcher is '
                f"{requested or 'none'!r}: every process would train on its own in the "
                'same work dir, overwriting the others\' checkpoints. Pass '
                f'--launcher {launcher} (or --launcher auto) to train as one '
                'distributed job, or start a single process without the launcher.')
        return
    missing = missing_variables(resolved, env)
    if missing:
        how = f'--launcher auto found {resolved}' if requested == 'auto' \
            else f'--launcher {resolved}'
        raise LaunchEnvironmentError(
            f"{how} needs the variable(s) {', '.join(missing)}, which this process does "
            f'not have: it was not started by that launcher. Start it with '
            f'{HOW_TO_START[resolved]}, or drop --launcher for a single process.')


def launch_rank(launcher: str, environ: Optional[Mapping[str, str]] = None) -> int:
    """Global rank of this process from the launcher's variables (0 for ``none``).

    Known before the process group exists, so a refusal (e.g. the work-dir lock) can
    happen before any rank waits for the others.
    """
    env = os.environ if environ is None else environ
    key = {'pytorch': 'RANK', 'slurm': 'SLURM_PROCID', 'mpi': 'OMPI_COMM_WORLD_RANK'}
    return _int(env, key[launcher], 0) if launcher in key else 0


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

    from ..utils.model import unwrap_model
    if runner is not None and is_model_wrapper(runner.model):
        runner.model = unwrap_model(runner.model)
        gc.collect()
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
