"""Two nodes on one host: two ``tools/dist_train.sh`` launches with ``NNODES=2`` (gloo,
CPU, the demo PointPillars config on a few synthetic KITTI frames, its training pipeline
without the database sampling and rotation whose numba kernels compile for ~20 s in
every process).

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
import socket

import pytest

from mmdet3d_scaling.datasets.synthetic.kitti import write_kitti
from tests.launches import Launch, launch_env

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
LIGHT = f'''
_base_ = [{DEMO!r}]
point_cloud_range = [0, -20.48, -3, 40.96, 20.48, 1]
train_pipeline = [
    dict(type='LoadPointsFromFile', coord_type='LIDAR', load_dim=4, use_dim=4),
    dict(type='LoadAnnotations3D', with_bbox_3d=True, with_label_3d=True),
    dict(type='PointsRangeFilter', point_cloud_range=point_cloud_range),
    dict(type='ObjectRangeFilter', point_cloud_range=point_cloud_range),
    dict(type='Pack3DDetInputs', keys=['points', 'gt_labels_3d', 'gt_bboxes_3d'])
]
train_dataloader = dict(dataset=dict(dataset=dict(pipeline=train_pipeline)))
'''


@pytest.fixture(scope='module')
def workspace(tmp_path_factory):
    """A folder with data/synthetic_kitti, where the demo config's paths point."""
    root = tmp_path_factory.mktemp('nodes')
    write_kitti(str(root / 'data' / 'synthetic_kitti'), train_frames=4, val_frames=1,
                seed=0, progress=False)
    (root / 'demo_light.py').write_text(LIGHT)
    return root


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def Node(cwd, args, **env) -> Launch:
    """One ``dist_train.sh`` launch of the light demo config."""
    return Launch(['bash', DIST_TRAIN, 'demo_light.py', *args], cwd, launch_env(**env))


def _two_nodes(cwd, args, port, nproc=1):
    return [Node(cwd, [str(nproc), *args], NNODES='2', NODE_RANK=str(rank),
                 MASTER_ADDR='127.0.0.1', PORT=str(port)) for rank in range(2)]


@pytest.fixture(scope='module')
def two_node_run(workspace):
    """The work dir and both nodes' logs of one job trained on two nodes (1 process each)."""
    work = workspace / 'work'
    nodes = _two_nodes(workspace, ['--work-dir', str(work), '--cfg-options', *OPTIONS],
                       _free_port())
    logs = [node.finish() for node in nodes]
    for node, log in zip(nodes, logs):
        assert node.proc.returncode == 0, log[-4000:]
    return work, logs


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_nodes_train_one_job_with_one_writer(two_node_run):
    work, logs = two_node_run
    both = ''.join(logs)
    assert sorted(f for f in os.listdir(work) if f.endswith('.pth')) == \
        ['iter_2.pth', 'iter_4.pth']
    assert both.count('Saving checkpoint at') == 2  # once per checkpoint, by rank 0
    assert both.count('ScalingRunner: plugin keys in this config') == 1  # once per job
    assert both.count('patches in effect') == 1
    assert PLAN in logs[0]  # the plan for the world of 2 nodes x 1
    assert 'WorkDirLockedError' not in both
    assert not (work / '.train.lock').exists()  # one holder (global rank 0), released


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_node_checkpoint_resumes_on_one_node_with_the_recipe(workspace, two_node_run):
    work, _ = two_node_run
    resume = Node(workspace, ['2', '--work-dir', str(work), '--resume', '--cfg-options',
                              *OPTIONS[:3], 'train_cfg.max_iters=3', *OPTIONS[4:]])
    log = resume.finish()
    assert resume.proc.returncode == 0, log[-4000:]
    assert PLAN in log  # one node x 2 processes: the same plan
    assert 'resumed epoch: 0, iter: 4' in log
    assert 'effective batch changed' not in log and 'resuming a checkpoint saved' not in log
    assert osp.isfile(work / 'iter_6.pth')
    assert log.count('ScalingRunner: plugin keys in this config') == 1


@pytest.mark.multiprocess
@pytest.mark.slow
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
            node.kill()
        raise
    victim.kill()  # node 1 dies: its torchrun and its worker, SIGKILL
    victim.finish()
    log = survivor.finish(timeout=240)  # the collective timeout (5 min) is later
    assert survivor.proc.returncode != 0
    assert log.count('hang doctor: on') == 1  # logged by global rank 0 only
    assert 'hang doctor (rank 0)' in log, log[-4000:]
    assert ('rank(s) 1 stopped sending heartbeats' in log
            or 'rank(s) 1 sent no heartbeat' in log), log[-4000:]
