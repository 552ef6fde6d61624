"""Interrupted writes leave the old files or files that are refused: real processes.

- ``tools/create_synthetic_data.py --overwrite`` SIGKILLed part way over a complete set:
  the old info files are whole, the marker says the run did not finish, and the data
  preflight refuses the folder with the command that writes it again (it used to train
  on seed-0 infos with seed-1 point files, rc 0);
- ``tools/demo.py``'s data step writes such a folder again instead of using it.
Checkpoint saves killed part way: ``tests/patches/fixes/test_checkpoint_save.py``.
"""
import json
import os
import os.path as osp
import pickle
import signal
import subprocess
import sys
import time

import pytest

import mmdet3d_scaling  # noqa: F401
from mmdet3d_scaling.config.data_files import BadDataFileError
from mmdet3d_scaling.config.preflight import check_data_paths
from mmdet3d_scaling.datasets.synthetic.kitti import ensure_kitti, write_kitti
from mmdet3d_scaling.datasets.synthetic.target import incomplete_run
from tests.datasets.synthetic_helpers import demo_config

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def _marker(root: str) -> dict:
    with open(osp.join(root, '.synthetic_kitti')) as f:
        return json.load(f)


def _kill_when(proc: subprocess.Popen, ready, timeout: float = 300) -> None:
    """SIGKILL ``proc`` as soon as ``ready()`` holds (fail if it ends first)."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, 'the generator finished before it could be killed'
        assert time.monotonic() < deadline, 'the generator wrote nothing in time'
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


@pytest.fixture
def killed_overwrite(tmp_path):
    """A complete seed-0 set (2 + 1 frames), then `--overwrite --seed 1` of 200 + 1
    frames killed once it has written new point files."""
    root = str(tmp_path / 'kitti')
    write_kitti(root, 2, 1, seed=0, progress=False)
    with open(osp.join(root, 'kitti_infos_train.pkl'), 'rb') as f:
        old_infos = f.read()
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.Popen(
        [sys.executable, osp.join(REPO, 'tools', 'create_synthetic_data.py'), 'kitti',
         '--out', root, '--train-frames', '200', '--val-frames', '1', '--seed', '1',
         '--overwrite', '--no-progress'], env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE)
    new_file = osp.join(root, 'training', 'velodyne', '000003.bin')  # not in the old set
    _kill_when(proc, lambda: osp.isfile(new_file))
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()[-2000:]
    proc.stderr.close()
    return root, old_infos


@pytest.mark.slow
def test_killed_overwrite_leaves_old_infos_and_a_refused_folder(killed_overwrite):
    root, old_infos = killed_overwrite
    with open(osp.join(root, 'kitti_infos_train.pkl'), 'rb') as f:
        assert f.read() == old_infos  # whole, the previous run's: never a cut info file
    marker = _marker(root)
    assert marker['arguments']['seed'] == 1 and marker['complete'] is False
    assert incomplete_run(root) == 'kitti'
    assert not [n for n in os.listdir(root) if n.endswith('.partial')]
    with pytest.raises(BadDataFileError) as err:
        check_data_paths(demo_config(root))
    msg = str(err.value)
    assert (f"data_root '{root}' holds an unfinished synthetic kitti dataset: its marker "
            '.synthetic_kitti says the generator run that last wrote it did not complete'
            ) in msg
    assert (f'`python tools/create_synthetic_data.py kitti --out {root} --train-frames 200 '
            '--val-frames 1 --seed 1 --overwrite`') in msg


@pytest.mark.slow
def test_demo_data_step_writes_an_unfinished_folder_again(killed_overwrite):
    root, _ = killed_overwrite
    assert ensure_kitti(root, 2, 1, seed=0) > 0  # not "using the synthetic data"
    assert incomplete_run(root) is None and _marker(root)['complete'] is True
    with open(osp.join(root, 'kitti_infos_train.pkl'), 'rb') as f:
        assert len(pickle.load(f)['data_list']) == 2
    check_data_paths(demo_config(root))
