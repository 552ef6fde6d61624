"""The command-line tools end to end, as subprocesses on a few synthetic KITTI frames.

- mmdet3d's own stock tools (shipped in the mmdet3d wheel) run this project's demo config
  unmodified: its ``custom_imports`` loads the plugin.
- ``tools/dist_train.sh`` starts 2 processes with torchrun (gloo on the CPU), the
  rendezvous port chosen by torchrun itself, also while 29500 (the old default) is taken.
- ``tools/train.py`` rejects an unknown launcher, naming it.
"""
import os
import os.path as osp
import socket
import subprocess
import sys

import mmdet3d
import pytest

from mmdet3d_scaling.datasets.synthetic.kitti import write_kitti
from tests.multiprocess import child_env

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DEMO = osp.join(REPO, 'configs', 'demo', 'pointpillars_synthetic_kitti_cpu.py')
STOCK_TOOLS = osp.join(osp.dirname(mmdet3d.__file__), '.mim', 'tools')
EVAL_LOADERS = ['val_dataloader.num_workers=0', 'val_dataloader.persistent_workers=False',
                'test_dataloader.num_workers=0', 'test_dataloader.persistent_workers=False']
TRAIN = ['train_cfg.max_iters=2', 'default_hooks.checkpoint.interval=2', 'param_scheduler=[]',
         'train_dataloader.batch_size=2', 'train_dataloader.num_workers=0',
         'train_dataloader.persistent_workers=False', *EVAL_LOADERS]


@pytest.fixture(scope='module')
def workspace(tmp_path_factory):
    """A folder with data/synthetic_kitti, where the demo config's relative paths point."""
    root = tmp_path_factory.mktemp('tools')
    write_kitti(str(root / 'data' / 'synthetic_kitti'), train_frames=4, val_frames=2,
                seed=0, progress=False)
    return root


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=REPO)
    env.pop('MMDET3D_SCALING_TRUSTED_CHECKPOINTS', None)
    return env


def _run(args, cwd, env=None, timeout=600) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, cwd=cwd, env=env or _env(), capture_output=True,
                          text=True, timeout=timeout)
    return proc


@pytest.mark.slow
def test_stock_mmdet3d_tools_run_our_config(workspace):
    work = str(workspace / 'stock')
    train = _run([sys.executable, osp.join(STOCK_TOOLS, 'train.py'), DEMO,
                  '--work-dir', work, '--cfg-options', *TRAIN, 'train_cfg.val_interval=2'],
                 cwd=workspace)
    assert train.returncode == 0, train.stderr[-3000:]
    checkpoint = osp.join(work, 'iter_2.pth')
    assert osp.isfile(checkpoint)
    # The evaluation ran on the CPU (KITTI metric) and logged its results.
    assert 'pred_instances_3d/KITTI/Overall_3D_AP40_moderate:' in train.stdout + train.stderr
    # Stock test.py loads our checkpoint through the plugin's safe loader, no trust flag.
    test = _run([sys.executable, osp.join(STOCK_TOOLS, 'test.py'), DEMO, checkpoint,
                 '--work-dir', work, '--cfg-options', *EVAL_LOADERS], cwd=workspace)
    assert test.returncode == 0, test.stderr[-3000:]
    assert 'pred_instances_3d/KITTI/Overall_3D_AP40_moderate:' in test.stdout + test.stderr


@pytest.mark.multiprocess
@pytest.mark.slow
def test_dist_train_two_processes_while_the_default_port_is_taken(workspace):
    with socket.socket() as busy:
        try:
            busy.bind(('', 29500))  # another job on the classic default port
            busy.listen()
        except OSError:
            pass  # already taken by someone else: the same situation
        # CPU ranks (gloo) where CUDA shows fewer GPUs than the 2 ranks
        env = child_env(2, dict(_env(), PYTHON=sys.executable))
        proc = _run(['bash', osp.join(REPO, 'tools', 'dist_train.sh'), DEMO, '2',
                     '--work-dir', str(workspace / 'dist'), '--cfg-options', *TRAIN,
                     'train_cfg.val_interval=100'], cwd=workspace, env=env)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert 'EADDRINUSE' not in log
    assert osp.isfile(workspace / 'dist' / 'iter_2.pth')
    assert 'Distributed training is not used' not in log  # really 2 processes


@pytest.mark.slow
def test_unknown_launcher_is_named(workspace):
    proc = _run([sys.executable, osp.join(REPO, 'tools', 'train.py'), DEMO,
                 '--launcher', 'torchrun'], cwd=workspace, timeout=300)
    assert proc.returncode != 0
    assert "invalid choice: 'torchrun'" in proc.stderr and 'auto' in proc.stderr
