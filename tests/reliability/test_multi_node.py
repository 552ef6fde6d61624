"""Two nodes on one host: two ``tools/dist_train.sh`` launches with ``NNODES=2`` (gloo,
CPU, the demo PointPillars config on a few synthetic KITTI frames).

- both nodes train one job: the checkpoints are written once (global rank 0), the work
  dir they share has one lock holder for the job, the start-up lines (plugin keys, patch
  table) appear once for the job;
- the checkpoint resumes on one node x 2 processes with the recipe kept (same plan:
  total batch = world size x batch per GPU x accumulation);
- killing one node (its torchrun and workers, SIGKILL) makes the other exit non-zero
  within the hang doctor's time, naming the lost rank, instead of waiting for the
  collective timeout; no process of the surviving node is left.
"""
import os
import os.path as osp
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from mmdet3d_scaling.datasets.synthetic.kitti import write_kitti
from tests.engine.test_hang_doctor import launch_env, wait_for_session_end

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DIST_TRAIN = osp.join(REPO, 'tools', 'dist_train.sh')
DEMO = osp.join(REPO, 'configs', 'demo', 'pointpillars_synthetic_kitti_cpu.py')
# plan 4 = 2 GPUs x 1 x 2 accumulation; max_iters / checkpoint interval count optimizer
# steps under the recipe: 2 steps = 4 micro-iterations, a checkpoint every step
OPTIONS = ['scaling.total_batch_size=4', 'scaling.base_batch_size=4',
           'scaling.max_per_gpu_batch_size=1', 'train_cfg.max_iters=2',
           'train_cfg.val_begin=1000', 'default_hooks.checkpoint.interval=1',
           'default_hooks.logger.interval=1', 'param_scheduler=[]',
           'train_dataloader.num_workers=0', 'train_dataloader.persistent_workers=False',
           'val_dataloader.num_workers=0', 'val_dataloader.persistent_workers=False',
           'test_dataloader.num_workers=0', 'test_dataloader.persistent_workers=False']
PLAN = '4 = 2 x 1 x 2'


@pytest.fixture(scope='module')
def workspace(tmp_path_factory):
    """A folder with data/synthetic_kitti, where the demo config's paths point."""
    root = tmp_path_factory.mktemp('nodes')
    write_kitti(str(root / 'data' / 'synthetic_kitti'), train_frames=4, val_frames=1,
                seed=0, progress=False)
    return root


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


class Node:
    """One ``dist_train.sh`` launch in its own session; output collected as it comes."""

    def __init__(self, cwd, args, **env):
        self.proc = subprocess.Popen(['bash', DIST_TRAIN, DEMO, *args], cwd=cwd,
                                     env=launch_env(**env), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.lines = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def log(self) -> str:
        return ''.join(self.lines)

    def wait_for(self, text: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log:
            assert self.proc.poll() is None, self.log[-4000:]
            assert time.monotonic() < deadline, f'no {text!r} in:\n{self.log[-4000:]}'
            time.sleep(0.2)

    def finish(self, timeout: float = 300) -> str:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            left = wait_for_session_end(self.proc.pid)
            self._reader.join(timeout=10)
        assert left == [], f'processes left running: {left}'
        return self.log


def _two_nodes(cwd, args, port, nproc=1):
    return [Node(cwd, [str(nproc), *args], NNODES='2', NODE_RANK=str(rank),
                 MASTER_ADDR='127.0.0.1', PORT=str(port)) for rank in range(2)]


def test_two_nodes_train_once_then_resume_on_one_node_with_the_recipe(workspace):
    work = workspace / 'work'
    nodes = _two_nodes(workspace, ['--work-dir', str(work), '--cfg-options', *OPTIONS],
                       _free_port())
    logs = [node.finish() for node in nodes]
    for node, log in zip(nodes, logs):
        assert node.proc.returncode == 0, log[-4000:]
    both = ''.join(logs)
    assert sorted(f for f in os.listdir(work) if f.endswith('.pth')) == \
        ['iter_2.pth', 'iter_4.pth']
    assert both.count('Saving checkpoint at') == 2  # once per checkpoint, by rank 0
    assert both.count('ScalingRunner: plugin keys in this config') == 1  # once per job
    assert both.count('patches in effect') == 1
    assert PLAN in logs[0]  # the plan for the world of 2 nodes x 1
    assert 'WorkDirLockedError' not in both
    assert not (work / '.train.lock').exists()  # one holder (global rank 0), released
    # one node x 2 processes: same world size, the recipe resumes unchanged
    resume = Node(workspace, ['2', '--work-dir', str(work), '--resume', '--cfg-options',
                              *OPTIONS[:3], 'train_cfg.max_iters=3', *OPTIONS[4:]])
    log = resume.finish()
    assert resume.proc.returncode == 0, log[-4000:]
    assert PLAN in log
    assert 'resumed epoch: 0, iter: 4' in log
    assert 'effective batch changed' not in log and 'resuming a checkpoint saved' not in log
    assert osp.isfile(work / 'iter_6.pth')
    assert log.count('ScalingRunner: plugin keys in this config') == 1


def test_killing_one_node_stops_the_other_within_the_doctor_time(workspace):
    options = [o for o in OPTIONS if not o.startswith('train_cfg.max_iters')]
    nodes = _two_nodes(workspace, ['--work-dir', str(workspace / 'killed'), '--cfg-options',
                                   *options, 'train_cfg.max_iters=1000',
                                   'distributed.hang_timeout_s=10',
                                   'distributed.timeout_minutes=5'], _free_port())
    survivor, victim = nodes
    try:
        survivor.wait_for('Iter(train) [')  # both nodes train
    except AssertionError:
        for node in nodes:
            os.killpg(node.proc.pid, signal.SIGKILL)
        raise
    os.killpg(victim.proc.pid, signal.SIGKILL)  # node 1: torchrun and its workers
    victim.finish()
    log = survivor.finish(timeout=240)  # the collective timeout (5 min) is later
    assert survivor.proc.returncode != 0
    assert log.count('hang doctor: on') == 1  # logged by global rank 0 only
    assert 'hang doctor (rank 0)' in log, log[-4000:]
    assert ('rank(s) 1 stopped sending heartbeats' in log
            or 'rank(s) 1 sent no heartbeat' in log), log[-4000:]
