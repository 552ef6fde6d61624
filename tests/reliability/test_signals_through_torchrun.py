"""Signals to a ``tools/dist_train.sh`` launch: every rank saves, the job exits 0, and
no rank or loader worker outlives the launcher (real torchrun, two gloo ranks, CPU).

torchrun starts its ranks in sessions of their own, so a signal to the launch's
process group used to reach torchrun alone: SIGUSR1 killed it (exit 138) and left the
ranks training as orphans; SIGTERM ended with torchrun's ``SignalException`` (exit 1).
"""
import os
import os.path as osp
import signal
import subprocess
import time

import pytest

from mmdet3d_scaling.parallel.signal_relay import rank_pids

from ..launches import launch_env

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DIST_TRAIN = osp.join(REPO, 'tools', 'dist_train.sh')

CONFIG = '''
custom_imports = dict(imports=['mmdet3d_scaling', 'tests.toy',
                               'tests.reliability.signal_parts'],
                      allow_failed_imports=False)
runner_type = 'ScalingRunner'
default_scope = 'mmdet3d'  # the plugin's hooks are in mmdet3d's registries
model = dict(type='ToyRegressor')
train_dataloader = dict(
    dataset=dict(type='ToyDataset', length=64), batch_size=2, num_workers=1,
    persistent_workers=True, sampler=dict(type='DefaultSampler', shuffle=True),
    collate_fn=dict(type='default_collate'))
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.01))
train_cfg = dict(by_epoch=False, max_iters=400)
default_hooks = dict(checkpoint=dict(type='CheckpointHook', interval=400, by_epoch=False))
custom_hooks = [dict(type='PreemptionHook'),
                dict(type='SlowIterHook', marker={marker!r}, at=2, wait_s=0.3)]
env_cfg = dict(dist_cfg=dict(backend='gloo', timeout=300))
preflight = dict(check_data=False)
log_level = 'INFO'
'''


def _descendants(pid: int) -> set:
    """Every process below ``pid`` (Linux /proc)."""
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f'/proc/{parent}/task')
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f'/proc/{parent}/task/{tid}/children') as f:
                    kids = {int(p) for p in f.read().split()}
            except OSError:
                continue
            todo += list(kids - found)
            found |= kids
    return found


def _alive(pids: set) -> set:
    alive = set()
    for pid in pids:
        try:
            with open(f'/proc/{pid}/stat') as f:
                if f.read().rsplit(')', 1)[1].split()[0] != 'Z':
                    alive.add(pid)
        except OSError:
            continue
    return alive


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize('signame', ['SIGUSR1', 'SIGTERM'])
def test_a_signal_to_the_launch_group_saves_on_every_rank_and_exits_0(tmp_path, signame):
    marker, work = str(tmp_path / 'reached'), tmp_path / 'work'
    cfg = tmp_path / 'toy_signal.py'
    cfg.write_text(CONFIG.format(marker=marker))
    proc = subprocess.Popen(['bash', DIST_TRAIN, str(cfg), '2', '--work-dir', str(work)],
                            cwd=str(tmp_path), env=launch_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    while not all(osp.exists(f'{marker}.rank{r}') for r in (0, 1)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.1)
    below = _descendants(proc.pid)  # torchrun, 2 ranks, their loader workers
    try:
        assert [p for p in below | {proc.pid} if len(rank_pids(p)) == 2], below
        assert len(below | {proc.pid}) >= 5, below  # (torchrun is the launcher before)
        os.killpg(proc.pid, getattr(signal, signame))  # what Slurm / kill -- -PGID do
        log, _ = proc.communicate(timeout=240)
    finally:  # nothing of the launch outlives the test, whatever failed
        time.sleep(0.5)
        left = _alive(below)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert not left, f'left running after the launcher ended: {left}\n{log[-3000:]}'
    assert proc.returncode == 0, log[-4000:]
    assert f'PreemptionHook: {signame} received: saved {work}/iter_' in log, log[-4000:]
    assert 'SignalException' not in log
    saved = [f for f in os.listdir(work) if f.endswith('.pth')]
    assert len(saved) == 1 and saved[0] != 'iter_400.pth'  # stopped in the middle
