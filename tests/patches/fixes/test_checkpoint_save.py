"""checkpoint_save: a checkpoint under its final name is always whole (real processes).

A save that fails part way is made real with the kernel's file-size limit
(``RLIMIT_FSIZE``): the write stops with ``EFBIG`` after the limit, as a full disk or a
kill would stop it. Upstream leaves the cut file as ``iter_N.pth``; the patch leaves the
previous file (or none) and no temporary file.
"""
import glob
import os
import os.path as osp
import signal
import subprocess
import sys
import time

import pytest
import torch

import mmdet3d_scaling  # noqa: F401  (applies the fixes set)
from mmdet3d_scaling.patches.fixes import checkpoint as loader
from mmdet3d_scaling.patches import patching

REPO = osp.dirname(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

_SAVE_UNDER_LIMIT = '''
import os, resource, signal, sys
import torch
if sys.argv[3] == 'patched':
    import mmdet3d_scaling  # applies the fixes set
from mmengine.runner import runner  # the binding Runner.save_checkpoint calls
path, limit = sys.argv[1], int(sys.argv[2])
runner.save_checkpoint(dict(meta=dict(iter=1), w=torch.zeros(1000)), path)  # whole, ~4 kB
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG as an error, not a signal
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
try:
    runner.save_checkpoint(dict(meta=dict(iter=2), w=torch.ones(100000)), path)
except OSError as err:
    print('save failed:', err.strerror)
'''


def _save_under_limit(tmp_path, mode: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=REPO)
    return subprocess.run([sys.executable, '-c', _SAVE_UNDER_LIMIT,
                           str(tmp_path / 'iter_2.pth'), '50000', mode],
                          capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.slow
def test_upstream_leaves_a_cut_checkpoint_under_the_final_name(tmp_path):
    done = _save_under_limit(tmp_path, 'upstream')
    assert done.returncode == 0, done.stderr[-2000:]
    assert 'save failed: File too large' in done.stdout
    assert osp.getsize(tmp_path / 'iter_2.pth') == 50000  # cut: the defect
    assert not loader.readable_zip(str(tmp_path / 'iter_2.pth'))


@pytest.mark.slow
def test_a_failed_save_keeps_the_previous_file_and_no_partial(tmp_path):
    done = _save_under_limit(tmp_path, 'patched')
    assert done.returncode == 0, done.stderr[-2000:]
    assert 'save failed: File too large' in done.stdout
    ckpt = torch.load(tmp_path / 'iter_2.pth', weights_only=False)
    assert ckpt['meta']['iter'] == 1  # the whole previous file, not a cut new one
    assert os.listdir(tmp_path) == ['iter_2.pth']  # the temporary file is gone


_SAVE_LOOP = '''
import sys
import torch
import mmdet3d_scaling  # applies the fixes set
from mmengine.runner.checkpoint import save_checkpoint
folder = sys.argv[1]
state = dict(w=torch.randn(2_000_000))  # 8 MB: most of the time goes into writing
for i in range(1, 1000):
    state['meta'] = dict(iter=i)
    save_checkpoint(state, f'{folder}/iter_{i}.pth')
    print(i, flush=True)
'''


@pytest.mark.slow
def test_sigkill_during_saves_never_leaves_a_cut_checkpoint(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO)
    for round_ in range(3):  # kills at different points of a save
        folder = tmp_path / f'round{round_}'
        folder.mkdir()
        proc = subprocess.Popen([sys.executable, '-c', _SAVE_LOOP, str(folder)],
                                stdout=subprocess.PIPE, text=True, env=env)
        for _ in range(2 + round_):  # wait for a few whole saves, then kill mid-loop
            assert proc.stdout.readline(), 'the save loop stopped early'
        time.sleep(0.05 * round_)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        proc.stdout.close()
        names = glob.glob(str(folder / 'iter_*.pth'))
        assert len(names) >= 2
        for name in names:
            assert loader.readable_zip(name), f'{name} is cut'
            assert torch.load(name, weights_only=False)['meta']['iter'] >= 1


def test_the_patch_replaces_every_binding_and_reverts():
    import mmengine.runner
    import mmengine.runner.checkpoint
    import mmengine.runner.runner
    assert 'checkpoint_save' in patching.applied()
    owners = (mmengine.runner, mmengine.runner.checkpoint, mmengine.runner.runner)
    patched = {owner.save_checkpoint for owner in owners}
    assert len(patched) == 1
    upstream = patched.pop().original
    patching.revert(['checkpoint_save'])
    try:
        assert all(owner.save_checkpoint is upstream for owner in owners)
    finally:
        patching.apply(['checkpoint_save'])


def test_same_bytes_as_upstream(tmp_path):
    from mmengine.runner.checkpoint import save_checkpoint
    state = dict(meta=dict(iter=3), w=torch.arange(10.0))
    save_checkpoint(state, str(tmp_path / 'ours.pth'))
    save_checkpoint.original(state, str(tmp_path / 'upstream.pth'))
    ours = torch.load(tmp_path / 'ours.pth', weights_only=False)
    theirs = torch.load(tmp_path / 'upstream.pth', weights_only=False)
    assert ours['meta'] == theirs['meta'] and torch.equal(ours['w'], theirs['w'])
    assert osp.getsize(tmp_path / 'ours.pth') == osp.getsize(tmp_path / 'upstream.pth')


@pytest.mark.parametrize('backend_args', [dict(backend='local')])
def test_backend_args_go_to_upstream(tmp_path, backend_args):
    from mmengine.runner.checkpoint import save_checkpoint
    save_checkpoint(dict(a=1), str(tmp_path / 'x.pth'), backend_args=backend_args)
    assert torch.load(tmp_path / 'x.pth', weights_only=False) == dict(a=1)


_RUN_UNDER_LIMIT = '''
import resource, signal, sys
from mmengine.hooks import Hook
from mmengine.runner import Runner
import mmdet3d_scaling  # applies the fixes set
from tests.toy import toy_runner_cfg

class LimitAfter(Hook):
    """After iteration 2's checkpoint: a file-size limit below a checkpoint's size."""
    priority = 'LOWEST'
    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if runner.iter + 1 == 2:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG, as a full disk
            resource.setrlimit(resource.RLIMIT_FSIZE, (60000, 60000))

cfg = toy_runner_cfg(sys.argv[1], max_iters=4, model=dict(type='ToyRegressor',
                     in_features=40000))
cfg['train_dataloader']['dataset'] = dict(type='ToyDataset', in_features=40000)
cfg['default_hooks']['checkpoint']['interval'] = 2
cfg['custom_hooks'] = [LimitAfter()]
Runner(**cfg).train()
'''


@pytest.mark.slow
def test_a_save_past_the_file_size_limit_names_the_checkpoint_and_what_is_intact(tmp_path):
    work = tmp_path / 'run'
    env = dict(os.environ, PYTHONPATH=REPO)
    done = subprocess.run([sys.executable, '-c', _RUN_UNDER_LIMIT, str(work)],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert done.returncode != 0
    err = done.stderr
    assert 'CheckpointSaveError: saving checkpoint ' f'{work / "iter_4.pth"} (' in err, err[-3000:]
    assert 'failed: File too large. Nothing under that name changed: the previous ' \
           f'checkpoints and {work / "last_checkpoint"} (still naming ' \
           f'{work / "iter_2.pth"}) are intact.' in err
    assert '(`ulimit -f`)' in err and 'tools/train.py CONFIG --resume' in err
    assert (work / 'last_checkpoint').read_text().strip() == str(work / 'iter_2.pth')
    assert torch.load(work / 'iter_2.pth', weights_only=False)['meta']['iter'] == 2
    assert not (work / 'iter_4.pth').exists()
