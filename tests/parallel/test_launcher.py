"""Launcher detection and the launch checks, on given environments (no process group)."""
import pytest

from mmdet3d_scaling.parallel.launcher import (LaunchEnvironmentError, check_launch,
                                             detect_launcher, found_launch, launch_rank,
                                             missing_variables, resolve_launcher,
                                             slurm_step_tasks, world_size)

TORCHRUN = {'RANK': '1', 'WORLD_SIZE': '2', 'LOCAL_RANK': '1', 'MASTER_ADDR': 'localhost',
            'MASTER_PORT': '29500'}
SRUN = {'SLURM_JOB_ID': '77', 'SLURM_STEP_ID': '0', 'SLURM_PROCID': '3', 'SLURM_NTASKS': '8',
        'SLURM_STEP_NUM_TASKS': '8', 'SLURM_NODELIST': 'node[1-2]'}
# an sbatch script (batch step): job and task count, but no srun step with ranks
SBATCH = {'SLURM_JOB_ID': '77', 'SLURM_PROCID': '0', 'SLURM_NTASKS': '8',
          'SLURM_NODELIST': 'node[1-2]'}
SBATCH_STEP_ID = dict(SBATCH, SLURM_STEP_ID=str(0xFFFFFFFE))  # versions that set it
SALLOC = {'SLURM_JOB_ID': '78', 'SLURM_NTASKS': '4', 'SLURM_NODELIST': 'node1'}
MPIRUN = {'OMPI_COMM_WORLD_SIZE': '4', 'OMPI_COMM_WORLD_RANK': '2',
          'OMPI_COMM_WORLD_LOCAL_RANK': '2', 'MASTER_ADDR': 'node1'}


@pytest.mark.parametrize('env, expected', [
    ({}, 'none'),
    ({'RANK': '0', 'WORLD_SIZE': '2', 'LOCAL_RANK': '0'}, 'pytorch'),
    ({'RANK': '0', 'WORLD_SIZE': '1', 'LOCAL_RANK': '0'}, 'pytorch'),  # torchrun, one
    (SRUN, 'slurm'),
    (dict(SRUN, SLURM_STEP_NUM_TASKS='1', SLURM_NTASKS='1'), 'none'),  # srun -n 1
    (SBATCH, 'none'),
    (SBATCH_STEP_ID, 'none'),
    (SALLOC, 'none'),
    ({'OMPI_COMM_WORLD_SIZE': '4'}, 'mpi'),
    ({'PMI_SIZE': '2'}, 'mpi'),
    ({'OMPI_COMM_WORLD_SIZE': '1'}, 'none'),
])
def test_detect(env, expected):
    assert detect_launcher(env) == expected
    assert resolve_launcher('auto', env) == expected


def test_slurm_step_counts_the_step_tasks():
    # srun -n 2 inside an allocation of 8 tasks: the step has 2 ranks
    assert slurm_step_tasks(dict(SRUN, SLURM_STEP_NUM_TASKS='2')) == 2
    assert slurm_step_tasks(SBATCH) == 0 and slurm_step_tasks(SBATCH_STEP_ID) == 0


def test_explicit_launcher_is_kept():
    assert resolve_launcher('slurm', {}) == 'slurm'
    assert resolve_launcher(None, {}) == 'none'


def test_unknown_launcher_is_named():
    with pytest.raises(ValueError, match="'torchrun'.*auto"):
        resolve_launcher('torchrun', {})


def test_world_size():
    assert world_size('pytorch', {'WORLD_SIZE': '4'}) == 4
    assert world_size('slurm', {'SLURM_NTASKS': '16'}) == 16
    assert world_size('none', {'WORLD_SIZE': '4'}) == 1


@pytest.mark.parametrize('env, launcher, names', [
    (TORCHRUN, 'pytorch', 'torchrun (RANK=1, WORLD_SIZE=2'),
    (SRUN, 'slurm', 'a Slurm job step (srun: SLURM_STEP_ID=0'),
    (MPIRUN, 'mpi', 'mpirun (OMPI_COMM_WORLD_SIZE=4)'),
    ({'PMI_SIZE': '3'}, 'mpi', 'mpirun (PMI_SIZE=3)'),
])
def test_no_launcher_inside_a_launch_stops(env, launcher, names):
    assert found_launch(env)[0] == launcher
    with pytest.raises(LaunchEnvironmentError) as err:
        check_launch(None, 'none', env)
    message = str(err.value)
    assert names in message
    assert f'--launcher {launcher}' in message and '--launcher auto' in message


@pytest.mark.parametrize('env', [
    {}, dict(TORCHRUN, WORLD_SIZE='1', RANK='0', LOCAL_RANK='0'), SBATCH, SBATCH_STEP_ID,
    SALLOC, {'OMPI_COMM_WORLD_SIZE': '1'}])
def test_single_process_environments_pass(env):
    check_launch('none', 'none', env)
    check_launch('auto', resolve_launcher('auto', env), env)


@pytest.mark.parametrize('launcher, env, missing', [
    ('pytorch', {}, ['RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT']),
    ('pytorch', {'RANK': '0', 'WORLD_SIZE': '2'}, ['LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT']),
    ('slurm', {}, ['SLURM_PROCID', 'SLURM_NTASKS', 'SLURM_NODELIST']),
    ('slurm', SBATCH, ['SLURM_STEP_ID (a job step started by srun)']),
    ('mpi', {'PMI_SIZE': '2', 'MASTER_ADDR': 'h'},
     ['OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_SIZE', 'OMPI_COMM_WORLD_LOCAL_RANK']),
])
def test_explicit_launcher_without_its_variables_is_named(launcher, env, missing):
    assert missing_variables(launcher, env) == missing
    with pytest.raises(LaunchEnvironmentError) as err:
        check_launch(launcher, launcher, env)
    message = str(err.value)
    assert ', '.join(missing) in message
    start = {'pytorch': 'torchrun --nproc_per_node=N', 'slurm': 'srun', 'mpi': 'mpirun'}
    assert start[launcher] in message


@pytest.mark.parametrize('launcher, env', [
    ('pytorch', TORCHRUN), ('slurm', SRUN), ('mpi', MPIRUN),
    ('slurm', dict(SBATCH, SLURM_NTASKS='1'))])  # a batch step of one task trains alone
def test_explicit_launcher_with_its_variables_passes(launcher, env):
    check_launch(launcher, launcher, env)


def test_launch_rank_before_the_process_group():
    assert launch_rank('pytorch', TORCHRUN) == 1
    assert launch_rank('slurm', SRUN) == 3
    assert launch_rank('mpi', MPIRUN) == 2
    assert launch_rank('none', TORCHRUN) == 0
