import pytest

from mmdet3d_scaling.engine.launcher import detect_launcher, resolve_launcher, world_size


@pytest.mark.parametrize('env, expected', [
    ({}, 'none'),
    ({'RANK': '0', 'WORLD_SIZE': '2', 'LOCAL_RANK': '0'}, 'pytorch'),
    ({'SLURM_PROCID': '3', 'SLURM_NTASKS': '8'}, 'slurm'),
    ({'SLURM_PROCID': '0', 'SLURM_NTASKS': '1'}, 'none'),  # salloc shell, one task
    ({'OMPI_COMM_WORLD_SIZE': '4'}, 'mpi'),
    ({'PMI_SIZE': '2'}, 'mpi'),
    ({'OMPI_COMM_WORLD_SIZE': '1'}, 'none'),
])
def test_detect(env, expected):
    assert detect_launcher(env) == expected
    assert resolve_launcher('auto', env) == expected


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
