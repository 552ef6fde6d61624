"""Real data is never overwritten, and bad data files are named: real processes, files.

- ``tools/create_synthetic_data.py`` (every subcommand) refuses a non-empty ``--out``
  without ``--overwrite``, naming the folder, some entries, the count and the switch;
- ``tools/demo.py`` generates data only into an absent / empty / generator-made folder;
- ``tools/benchmark_gpu_monitor.py`` refuses to replace an existing ``--json-out``;
- ``tools/train.py`` names a zero-byte point file and ``tools/test.py`` an empty info
  file (the preflight before the run; the ``point_loading`` / ``info_files`` patches
  without the preflight).
"""
import os
import os.path as osp
import subprocess
import sys

import pytest

from mmdet3d_scaling.datasets.synthetic.kitti import write_kitti

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TOOLS = osp.join(REPO, 'tools')
DEMO_CONFIG = osp.join(REPO, 'configs', 'demo', 'pointpillars_synthetic_kitti_cpu.py')


def _run(*args: str, cwd: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=REPO)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _snapshot(root: str) -> dict:
    """relative path -> bytes of every file under ``root``."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = osp.join(dirpath, name)
            with open(path, 'rb') as f:
                out[osp.relpath(path, root)] = f.read()
    return out


def _real_dataset(root: str) -> dict:
    """A folder standing in for a real dataset (no generator marker)."""
    os.makedirs(osp.join(root, 'training', 'velodyne'))
    for i in range(3):
        with open(osp.join(root, 'training', 'velodyne', f'{i:06d}.bin'), 'wb') as f:
            f.write(b'\x01' * 64)
    with open(osp.join(root, 'kitti_infos_train.pkl'), 'wb') as f:
        f.write(b'real infos')
    return _snapshot(root)


@pytest.fixture(scope='module')
def workspace(tmp_path_factory):
    """cwd for the demo config: data/synthetic_kitti (generator-made, 2 + 1 frames)."""
    root = tmp_path_factory.mktemp('data_safety')
    write_kitti(str(root / 'data' / 'synthetic_kitti'), 2, 1, seed=0, progress=False)
    return root


@pytest.mark.slow
@pytest.mark.parametrize('subcommand', ['kitti', 'nuscenes'])
def test_create_synthetic_data_refuses_a_non_empty_out(tmp_path, subcommand):
    out = str(tmp_path / 'kitti')
    before = _real_dataset(out)
    done = _run(osp.join(TOOLS, 'create_synthetic_data.py'), subcommand, '--out', out,
                '--train-frames', '1', '--val-frames', '1', '--no-progress', cwd=str(tmp_path))
    assert done.returncode == 1, done.stderr[-2000:]
    assert 'Traceback' not in done.stderr
    assert f"refusing to write synthetic {subcommand} data into '{out}'" in done.stderr
    assert '2 entries: kitti_infos_train.pkl, training' in done.stderr
    assert '--overwrite' in done.stderr
    assert _snapshot(out) == before  # not a byte written


@pytest.mark.slow
def test_create_synthetic_data_overwrite_and_marker(tmp_path):
    out = str(tmp_path / 'synthetic')
    args = (osp.join(TOOLS, 'create_synthetic_data.py'), 'kitti', '--out', out,
            '--train-frames', '1', '--val-frames', '1', '--no-progress')
    assert _run(*args, cwd=str(tmp_path)).returncode == 0
    assert osp.isfile(osp.join(out, '.synthetic_kitti'))
    again = _run(*args, cwd=str(tmp_path))
    assert again.returncode == 1 and 'written by this generator before' in again.stderr
    assert _run(*args, '--overwrite', cwd=str(tmp_path)).returncode == 0


@pytest.mark.slow
def test_demo_never_generates_over_foreign_files(tmp_path):
    root = str(tmp_path / 'data' / 'synthetic_kitti')
    before = _real_dataset(root)
    done = _run(osp.join(TOOLS, 'demo.py'), '--work-dir', str(tmp_path / 'work'),
                cwd=str(tmp_path))
    assert done.returncode == 1, done.stderr[-2000:]
    assert "data_root 'data/synthetic_kitti/' lacks kitti_infos_val.pkl" in done.stderr
    assert 'no .synthetic_kitti marker' in done.stderr
    assert _snapshot(root) == before
    assert not osp.exists(tmp_path / 'work')  # stopped before training


def test_demo_generates_into_empty_or_its_own_folder(tmp_path):
    from mmdet3d_scaling.datasets.synthetic.kitti import ensure_kitti
    empty = tmp_path / 'empty'
    empty.mkdir()
    assert ensure_kitti(str(empty), 1, 1, seed=0) > 0
    assert (empty / '.synthetic_kitti').is_file()
    os.remove(empty / 'kitti_infos_val.pkl')  # an interrupted earlier run
    assert ensure_kitti(str(empty), 1, 1, seed=0) > 0  # its own folder: regenerated
    stamp = os.stat(empty / 'kitti_infos_val.pkl').st_mtime_ns
    assert ensure_kitti(str(empty), 1, 1, seed=0) == 0.0  # complete: reused as is
    assert os.stat(empty / 'kitti_infos_val.pkl').st_mtime_ns == stamp


@pytest.mark.slow
def test_benchmark_json_out_is_not_replaced(tmp_path):
    result = tmp_path / 'result.json'
    result.write_text('{"summary": "yesterday"}')
    done = _run(osp.join(TOOLS, 'benchmark_gpu_monitor.py'), '--json-out', str(result),
                '--iters', '1', '--warmup', '0', '--repeats', '1', cwd=str(tmp_path))
    assert done.returncode == 2
    assert f"--json-out '{result}' exists" in done.stderr and '--overwrite' in done.stderr
    assert result.read_text() == '{"summary": "yesterday"}'


@pytest.mark.slow
def test_camera_decoding_out_is_not_replaced(tmp_path):
    result = tmp_path / 'camera.json'
    result.write_text('{"runs": "yesterday"}')
    done = _run(osp.join(REPO, 'benchmarks', 'camera_decoding.py'), '--data-root',
                str(tmp_path), '--out', str(result), cwd=str(tmp_path))
    assert done.returncode == 2
    assert f"--out '{result}' exists" in done.stderr and '--overwrite' in done.stderr
    assert result.read_text() == '{"runs": "yesterday"}'


@pytest.mark.slow
def test_train_names_a_zero_byte_point_file(workspace, tmp_path):
    import shutil
    shutil.copytree(workspace / 'data', tmp_path / 'data')
    for name in ('000000.bin', '000001.bin'):  # every train frame: any order hits one
        open(tmp_path / 'data' / 'synthetic_kitti' / 'training' / 'velodyne_reduced' / name,
             'wb').close()
    args = (osp.join(TOOLS, 'train.py'), DEMO_CONFIG, '--work-dir', str(tmp_path / 'w'),
            '--cfg-options', 'train_dataloader.num_workers=0',
            'train_dataloader.persistent_workers=False', 'train_cfg.max_iters=1')
    done = _run(*args, cwd=str(tmp_path), timeout=600)
    assert done.returncode != 0
    assert 'BadDataFileError' in done.stderr  # the preflight, before the first iteration
    for name in ('000000.bin', '000001.bin'):
        assert f'velodyne_reduced/{name} is empty (0 bytes)' in done.stderr
    # without the preflight, the loader names the file it reaches
    done = _run(*args, 'preflight.check_data=False', cwd=str(tmp_path), timeout=600)
    assert done.returncode != 0
    assert 'EmptyPointCloudError' in done.stderr
    assert 'velodyne_reduced/00000' in done.stderr and 'is empty (0 bytes)' in done.stderr


@pytest.mark.slow
def test_test_names_an_empty_info_file(workspace, tmp_path):
    import shutil
    shutil.copytree(workspace / 'data', tmp_path / 'data')
    info = 'data/synthetic_kitti/kitti_infos_val.pkl'
    open(tmp_path / info, 'wb').close()
    args = (osp.join(TOOLS, 'test.py'), DEMO_CONFIG, str(tmp_path / 'absent.pth'),
            '--work-dir', str(tmp_path / 'w'))
    done = _run(*args, cwd=str(tmp_path))
    assert done.returncode != 0
    assert 'MissingDataError' in done.stderr
    assert f"ann_file='data/synthetic_kitti/kitti_infos_val.pkl' is empty (0 bytes" in \
        done.stderr
    done = _run(*args, '--cfg-options', 'preflight.check_data=False', cwd=str(tmp_path))
    assert done.returncode != 0
    assert f'CorruptInfoFileError: info file {info} is empty (0 bytes)' in done.stderr
    assert 'create_synthetic_data.py kitti --out' in done.stderr
