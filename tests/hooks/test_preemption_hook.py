"""PreemptionHook with real signals, processes, Runners and checkpoint files (CPU).

A training subprocess gets SIGTERM / SIGUSR1 in the middle of an epoch: it saves a
checkpoint at the next optimizer step (the end of an accumulation window), logs its
path and exits 0; ``--resume`` continues at the exact sample position. The samples the
interrupted + resumed run trained on equal the uninterrupted run's (in order, hence as
a multiset) and the final weights are bit-exact. Two gloo ranks of which only one got
the signal stop after the same iteration.
"""
import glob
import json
import os
import os.path as osp
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from typing import List

import pytest
import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.registry import DATASETS, HOOKS, MODELS
from mmengine.runner import Runner

import mmdet3d_scaling  # noqa: F401
from mmdet3d_scaling.datasets import ResumableSampler
from mmdet3d_scaling.hooks.gradient_cumulative_optimizer_hook import CHECKPOINT_KEY
from mmdet3d_scaling.hooks.preemption_hook import POSITION_KEY, Preempted
from tests.parallel.dist_parts import spawn_checks
from tests.toy import ToyDataset, ToyRegressor

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


# ------------------------------------------------------------------ registered parts
@DATASETS.register_module(name='PRIndexedDataset', force=True)
class PRIndexedDataset(ToyDataset):
    """ToyDataset whose samples carry their index (to record what was trained)."""

    def __getitem__(self, idx: int) -> dict:
        return dict(super().__getitem__(idx), index=idx)


@DATASETS.register_module(name='PRAugmentedDataset', force=True)
class PRAugmentedDataset(PRIndexedDataset):
    """PRIndexedDataset with a random augmentation from python's, numpy's and torch's
    global streams, as mmdet3d's transforms draw them (in the loader workers)."""

    def __getitem__(self, idx: int) -> dict:
        import random
        import numpy as np
        item = super().__getitem__(idx)
        noise = random.random() + float(np.random.uniform()) + float(torch.rand(()))
        return dict(item, inputs=item['inputs'] * (0.5 + noise / 3))


@MODELS.register_module(name='PRDropoutToy', force=True)
class PRDropoutToy(ToyRegressor):
    """ToyRegressor with dropout on its inputs: the main process's torch stream."""

    def forward(self, inputs, targets=None, index=None, mode='tensor'):
        inputs = torch.stack(inputs) if isinstance(inputs, list) else inputs
        return super().forward(torch.nn.functional.dropout(inputs, 0.3, self.training),
                               targets, mode)


@MODELS.register_module(name='PRToy', force=True)
class PRToy(ToyRegressor):
    """ToyRegressor that accepts (and ignores) the sample index."""

    def forward(self, inputs, targets=None, index=None, mode='tensor'):
        return super().forward(inputs, targets, mode)


@HOOKS.register_module(name='PRRecordHook', force=True)
class PRRecordHook(Hook):
    """Appends one JSON line per iteration (rank, epoch, iter, sample indices) to
    ``path.rank<r>``; written at once, so an interrupted process leaves its part."""

    priority = 'LOWEST'

    def __init__(self, path: str):
        self.path = path

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        line = dict(epoch=runner.epoch, iter=runner.iter,
                    indices=data_batch['index'].tolist())
        with open(f'{self.path}.rank{runner.rank}', 'a') as f:
            f.write(json.dumps(line) + '\n')


@HOOKS.register_module(name='PRSignalAt', force=True)
class PRSignalAt(Hook):
    """Sends ``signame`` to its own process before iteration ``at`` (0-based) on
    ``rank``; with ``marker``, writes that file instead and waits for a signal from
    outside (a slow iteration loop the test's process interrupts)."""

    priority = 'LOWEST'

    def __init__(self, at: int, signame: str = 'SIGTERM', rank: int = 0,
                 marker: str = None, wait_s: float = 0.0):
        self.at, self.signame, self.rank = at, signame, rank
        self.marker, self.wait_s = marker, wait_s

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        if self.marker is not None:
            if runner.iter == self.at:
                open(self.marker, 'w').close()
            time.sleep(self.wait_s)  # slow enough for the outside signal to land
        elif runner.iter == self.at and runner.rank == self.rank:
            os.kill(os.getpid(), getattr(signal, self.signame))


@HOOKS.register_module(name='PRSignalInVal', force=True)
class PRSignalInVal(Hook):
    """Sends SIGTERM to its own process in the first validation batch."""

    def before_val_iter(self, runner, batch_idx, data_batch=None) -> None:
        if batch_idx == 0:
            os.kill(os.getpid(), signal.SIGTERM)


from mmengine.evaluator import BaseMetric  # noqa: E402
from mmengine.registry import METRICS  # noqa: E402


@METRICS.register_module(name='PRMeanMetric', force=True)
class PRMeanMetric(BaseMetric):
    """Mean prediction (enough for a validation loop to run)."""

    def process(self, data_batch, data_samples):
        self.results.append(float(torch.as_tensor(data_samples).mean()))

    def compute_metrics(self, results):
        return dict(mean_pred=sum(results) / len(results))


# ------------------------------------------------------------------------ helpers
def pr_cfg(work_dir: str, record: str, *, epochs: int = 3, length: int = 16,
           accumulation: int = 1, iters: int = 0, hooks: List[dict] = (),
           launcher: str = 'none', **extra) -> Config:
    """Toy run with PreemptionHook: epoch-based (``epochs``) or ``iters`` iterations."""
    if iters:
        loop = dict(type='IterBasedTrainLoop', max_iters=iters)
        ckpt = dict(type='CheckpointHook', by_epoch=False, interval=iters)
    else:
        loop = dict(type='EpochBasedTrainLoop', max_epochs=epochs)
        ckpt = dict(type='CheckpointHook', by_epoch=True, interval=1)
    cfg = dict(
        default_scope='mmdet3d', runner_type='ScalingRunner', experiment_name='pr',
        model=dict(type='PRToy'), work_dir=work_dir, launcher=launcher,
        train_dataloader=dict(
            dataset=dict(type='PRIndexedDataset', length=length), batch_size=2,
            num_workers=0, sampler=dict(type='DefaultSampler', shuffle=True),
            collate_fn=dict(type='default_collate')),
        optim_wrapper=dict(type='OptimWrapper', accumulative_counts=accumulation,
                           optimizer=dict(type='SGD', lr=0.05, momentum=0.9)),
        param_scheduler=[dict(type='MultiStepLR', by_epoch=False, milestones=[9],
                              gamma=0.1)],
        train_cfg=loop,
        default_hooks=dict(checkpoint=ckpt, logger=dict(type='LoggerHook', interval=1)),
        custom_hooks=[dict(type='PreemptionHook'), dict(type='PRRecordHook', path=record),
                      *hooks],
        env_cfg=dict(dist_cfg=dict(backend='gloo', timeout=180)),
        log_level='INFO', randomness=dict(seed=0))
    if accumulation > 1:  # windows aligned to epochs, schedulers per optimizer step
        cfg['custom_hooks'].append(dict(type='GradientCumulativeOptimizerHook',
                                        cumulative_iters=accumulation))
        cfg['optim_wrapper'].pop('accumulative_counts')
    cfg.update(extra)
    return Config(cfg)


def train(cfg: Config) -> Runner:
    runner = Runner.from_cfg(cfg)
    runner.train()
    return runner


def records(record: str, rank: int = 0) -> List[dict]:
    with open(f'{record}.rank{rank}') as f:
        return [json.loads(line) for line in f]


def samples(lines: List[dict]) -> List[int]:
    return [i for line in lines for i in line['indices']]


RUN = """
import sys
sys.path.insert(0, {root!r})
import tests.hooks.test_preemption_hook  # registers the toy parts
from mmengine.config import Config
from mmengine.runner import Runner
Runner.from_cfg(Config.fromfile({config!r})).train()
"""


def start(cfg: Config, tmp_path, name: str, **popen) -> subprocess.Popen:
    config = str(tmp_path / f'{name}.py')
    cfg.dump(config)
    return subprocess.Popen([sys.executable, '-c', RUN.format(root=ROOT, config=config)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, **popen)


def resume(work: str, record: str, **kwargs) -> Runner:
    """`tools/train.py --resume` (no path): the work dir's last_checkpoint."""
    with open(osp.join(work, 'last_checkpoint')) as f:
        ckpt = f.read().strip()
    return train(pr_cfg(work, record, resume=True, trusted_checkpoints=[ckpt], **kwargs))


def assert_same_weights(a: Runner, b: Runner) -> None:
    for name, value in a.model.state_dict().items():
        assert torch.equal(value, b.model.state_dict()[name]), name


def interrupted_then_resumed(tmp_path, signal_hook: dict, **kwargs):
    """(uninterrupted runner, its record, resumed runner, record, log, saved path)."""
    ref_record, record = str(tmp_path / 'ref'), str(tmp_path / 'run')
    whole = train(pr_cfg(str(tmp_path / 'whole'), ref_record, **kwargs))
    work = str(tmp_path / 'work')
    proc = start(pr_cfg(work, record, hooks=[signal_hook], **kwargs), tmp_path, 'killed')
    log, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, log[-3000:]
    found = re.search(r'received: saved (\S+) at iteration', log)
    assert found and osp.isfile(found.group(1)), log[-3000:]
    saved = found.group(1)
    resumed = resume(work, record, **kwargs)
    return whole, ref_record, resumed, record, log, saved


# -------------------------------------------------------------------------- tests
@pytest.mark.slow
def test_sigterm_mid_epoch_saves_exits_0_and_resumes_exactly(tmp_path):
    whole, ref, resumed, run, log, saved = interrupted_then_resumed(
        tmp_path, dict(type='PRSignalAt', at=11))  # iteration 12 of 24, in epoch 2
    assert f'PreemptionHook: SIGTERM received: saved {saved} at iteration 12 (epoch 2, ' \
           '8 samples into it); exiting with code 0' in log
    assert osp.basename(saved) == 'iter_12.pth'
    meta = torch.load(saved, weights_only=False)['meta']
    assert meta[POSITION_KEY]['samples'] == 8 and meta['epoch'] == 1
    # the sampler the config asked for was swapped for one that can skip
    assert isinstance(resumed.train_dataloader.sampler, ResumableSampler)
    assert resumed.iter == whole.iter == 24 and resumed.epoch == whole.epoch == 3
    got, expected = records(run), records(ref)
    assert Counter(samples(got)) == Counter(samples(expected))
    assert [(r['epoch'], r['indices']) for r in got] == \
        [(r['epoch'], r['indices']) for r in expected]  # even the order
    assert_same_weights(resumed, whole)


@pytest.mark.slow
@pytest.mark.parametrize('workers, persistent', [(0, False), (2, False), (1, True)])
def test_random_augmentations_and_dropout_resume_bit_exactly(tmp_path, workers,
                                                              persistent):
    """Epoch loop, random augmentations in the workers (or the main process), dropout
    in the model: SIGTERM in epoch 2, --resume: the weights equal the uninterrupted
    run's (before: the resumed samples got other augmentations)."""
    loader = dict(dataset=dict(type='PRAugmentedDataset', length=16), batch_size=2,
                  num_workers=workers, persistent_workers=persistent,
                  sampler=dict(type='DefaultSampler', shuffle=True),
                  collate_fn=dict(type='default_collate'))
    whole, ref, resumed, run, log, saved = interrupted_then_resumed(
        tmp_path, dict(type='PRSignalAt', at=11), train_dataloader=loader,
        model=dict(type='PRDropoutToy'))
    assert osp.basename(saved) == 'iter_12.pth'
    assert 'rng_states' in torch.load(saved, weights_only=False)['meta']
    assert [(r['epoch'], r['indices']) for r in records(run)] == \
        [(r['epoch'], r['indices']) for r in records(ref)]
    assert_same_weights(resumed, whole)


@pytest.mark.slow
def test_accumulation_saves_at_the_end_of_a_window(tmp_path):
    # 14 samples / batch 2 = 7 iterations an epoch, windows of 2 aligned to epochs:
    # epoch 2 is iterations 7..13 with windows (7, 8) (9, 10) (11, 12) (13); the signal
    # before iteration 9 is acted on after iteration 10, the window's end
    whole, ref, resumed, run, log, saved = interrupted_then_resumed(
        tmp_path, dict(type='PRSignalAt', at=9), length=14, accumulation=2)
    assert osp.basename(saved) == 'iter_11.pth'
    ckpt = torch.load(saved, weights_only=False)
    assert CHECKPOINT_KEY not in ckpt  # no half-accumulated gradients to carry
    assert ckpt['meta'][POSITION_KEY]['batches'] == 4
    assert resumed.iter == whole.iter == 21
    assert Counter(samples(records(run))) == Counter(samples(records(ref)))
    assert_same_weights(resumed, whole)


@pytest.mark.slow
def test_sigusr1_from_outside_in_an_iteration_loop(tmp_path):
    # 12 iterations over 16 samples (the sampler's second pass starts at iteration 8);
    # the test's process sends SIGUSR1 once the child reached iteration 3
    ref, run = str(tmp_path / 'ref'), str(tmp_path / 'run')
    whole = train(pr_cfg(str(tmp_path / 'whole'), ref, iters=12))
    marker, work = str(tmp_path / 'reached'), str(tmp_path / 'work')
    slow = dict(type='PRSignalAt', at=3, marker=marker, wait_s=0.5)
    proc = start(pr_cfg(work, run, iters=12, hooks=[slow]), tmp_path, 'usr1')
    deadline = time.monotonic() + 240
    while not osp.exists(marker) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)
    log, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, log[-3000:]
    assert 'PreemptionHook: SIGUSR1 received: saved ' in log
    stopped = len(records(run))
    assert 4 <= stopped < 12  # stopped in the middle
    resumed = resume(work, run, iters=12, hooks=[])
    assert resumed.iter == 12
    assert Counter(samples(records(run))) == Counter(samples(records(ref)))
    assert_same_weights(resumed, whole)


@pytest.mark.slow
def test_sigterm_to_the_process_group_spares_the_loader_workers(tmp_path):
    # Slurm signals every process of a step: the loader worker too (torch's workers die
    # on SIGTERM, and the main process then fails "DataLoader worker ... killed")
    marker, work, run = str(tmp_path / 'reached'), str(tmp_path / 'work'), str(tmp_path / 'run')
    loader = dict(dataset=dict(type='PRIndexedDataset', length=16), batch_size=2,
                  num_workers=1, persistent_workers=True,
                  sampler=dict(type='DefaultSampler', shuffle=True),
                  collate_fn=dict(type='default_collate'))
    slow = dict(type='PRSignalAt', at=2, marker=marker, wait_s=0.5)
    proc = start(pr_cfg(work, run, iters=12, hooks=[slow], train_dataloader=loader),
                 tmp_path, 'group', start_new_session=True)
    deadline = time.monotonic() + 240
    while not osp.exists(marker) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)  # the child leads its own process group
    log, _ = proc.communicate(timeout=300)  # and ends: no worker left to wait for
    assert proc.returncode == 0, log[-3000:]
    assert 'PreemptionHook: SIGTERM received: saved ' in log
    assert 'killed by signal' not in log


def test_signal_while_saving_nothing_runs_the_previous_handler_on_repeat(tmp_path):
    """A second SIGTERM before the boundary falls back to the handler from before."""
    from mmdet3d_scaling.hooks.preemption_hook import PreemptionHook
    hook = PreemptionHook()
    seen = []
    before = signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
    try:
        hook._install()
        os.kill(os.getpid(), signal.SIGTERM)
        assert hook._received == signal.SIGTERM and not seen
        os.kill(os.getpid(), signal.SIGTERM)
        assert seen == [signal.SIGTERM]
    finally:
        hook._restore()
        signal.signal(signal.SIGTERM, before)


def test_bad_signal_names_are_refused():
    from mmdet3d_scaling.hooks.preemption_hook import PreemptionHook
    with pytest.raises(ValueError, match="'SIGKILL' is not a signal a process can catch"):
        PreemptionHook(signals=['SIGTERM', 'SIGKILL'])
    with pytest.raises(ValueError, match="'SIGTERN'"):
        PreemptionHook(signals='SIGTERN')


# ------------------------------------------------------------- two gloo processes
def check_ddp_reference(rank, world, out):
    runner = train(pr_cfg(osp.join(out, 'whole'), osp.join(out, 'ref'),
                          launcher='pytorch'))
    torch.save(runner.model.module.state_dict(), osp.join(out, f'whole{rank}.pth'))
    return {}


def check_ddp_interrupted(rank, world, out):
    # only rank 0 gets SIGTERM (before iteration 5); rank 1 must stop with it
    cfg = pr_cfg(osp.join(out, 'work'), osp.join(out, 'run'), launcher='pytorch',
                 hooks=[dict(type='PRSignalAt', at=5, rank=0)])
    try:
        train(cfg)
    except Preempted as stop:
        return dict(code=stop.code)
    return dict(code='not preempted')


def check_ddp_resumed(rank, world, out):
    work = osp.join(out, 'work')
    with open(osp.join(work, 'last_checkpoint')) as f:
        ckpt = f.read().strip()
    runner = train(pr_cfg(work, osp.join(out, 'run'), launcher='pytorch', resume=True,
                          trusted_checkpoints=[ckpt]))
    torch.save(runner.model.module.state_dict(), osp.join(out, f'resumed{rank}.pth'))
    return dict(saved=osp.basename(ckpt))


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_ranks_stop_together_and_resume_exactly(tmp_path):
    out = str(tmp_path)
    results = spawn_checks(2, out, [check_ddp_reference, check_ddp_interrupted,
                                    check_ddp_resumed])
    for rank in (0, 1):
        assert results[rank]['check_ddp_interrupted']['code'] == 0
        interrupted = records(osp.join(out, 'run'), rank)
        # both ranks stopped after iteration 5 (index) and resumed at 6: no iteration
        # twice, none left out (16 samples / 2 ranks / batch 2 = 4 a epoch, 3 epochs)
        assert [r['iter'] for r in interrupted] == list(range(12))
        assert Counter(samples(interrupted)) == Counter(
            samples(records(osp.join(out, 'ref'), rank)))
        whole = torch.load(osp.join(out, f'whole{rank}.pth'))
        resumed = torch.load(osp.join(out, f'resumed{rank}.pth'))
        assert all(torch.equal(whole[k], resumed[k]) for k in whole)
    assert results[0]['check_ddp_resumed']['saved'] == 'iter_6.pth'
    assert not glob.glob(osp.join(out, 'work', 'iter_7.pth'))


# ---------------------------------------------------- a clean exit with shielded workers
_LIVE_WORKERS_AT_EXIT = '''
import sys
sys.path.insert(0, {root!r})
import torch
from torch.utils.data import DataLoader
from mmdet3d_scaling.hooks.preemption_hook import _WorkersIgnore, _exiting_flag
from tests.toy import ToyDataset
import signal
loader = DataLoader(ToyDataset(length=400), batch_size=2, num_workers=2,
                    worker_init_fn=_WorkersIgnore([signal.SIGTERM, signal.SIGUSR1], None,
                                                  _exiting_flag()))
batches = iter(loader)
next(batches)  # workers alive while the interpreter exits (an iteration loop's end)
print('done', flush=True)
'''


@pytest.mark.slow
def test_shielded_workers_exit_0_when_the_main_process_ends(tmp_path):
    """multiprocessing's exit terminates the live workers: a shielded one used to die
    by the re-raised SIGTERM, and torch's SIGCHLD handler then printed `Exception
    ignored in atexit callback ... DataLoader worker (pid N) is killed by signal`
    (about every other run here)."""
    code = _LIVE_WORKERS_AT_EXIT.format(root=ROOT)
    for run in range(6):
        done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                              cwd=ROOT, timeout=300)
        assert done.returncode == 0 and 'done' in done.stdout, done.stderr[-3000:]
        assert 'Exception ignored' not in done.stderr, f'run {run}: {done.stderr[-3000:]}'
        assert 'killed by signal' not in done.stderr


@pytest.mark.slow
def test_an_iteration_loop_with_workers_ends_without_a_traceback(tmp_path):
    """A real Runner (ScalingRunner restarts the shielded workers of an iteration loop)
    run to its end three times: exit code 0 and nothing on stderr about the workers."""
    loader = dict(dataset=dict(type='PRIndexedDataset', length=64), batch_size=2,
                  num_workers=2, sampler=dict(type='DefaultSampler', shuffle=True),
                  collate_fn=dict(type='default_collate'))
    for run in range(3):
        cfg = pr_cfg(str(tmp_path / f'w{run}'), str(tmp_path / f'r{run}'), iters=4,
                     train_dataloader=loader)
        proc = start(cfg, tmp_path, f'end{run}')
        log, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, log[-3000:]
        assert 'Exception ignored' not in log and 'killed by signal' not in log, \
            f'run {run}: {log[-3000:]}'


@pytest.mark.slow
def test_sigterm_during_validation_saves_and_exits_without_a_traceback(tmp_path):
    """SIGTERM inside validation (shielded train workers, a val worker): the
    save comes at the next optimizer step, exit 0, and nothing on stderr about the
    workers (4 of 4 such runs of the demo used to end with the atexit traceback)."""
    train = dict(dataset=dict(type='PRIndexedDataset', length=64), batch_size=2,
                 num_workers=2, sampler=dict(type='DefaultSampler', shuffle=True),
                 collate_fn=dict(type='default_collate'))
    val = dict(dataset=dict(type='PRIndexedDataset', length=8), batch_size=2,
               num_workers=1, sampler=dict(type='DefaultSampler', shuffle=False),
               collate_fn=dict(type='default_collate'))
    for run in range(5):
        cfg = pr_cfg(str(tmp_path / f'w{run}'), str(tmp_path / f'r{run}'), iters=12,
                     train_dataloader=train, val_dataloader=val,
                     val_evaluator=dict(type='PRMeanMetric'), val_cfg=dict(),
                     hooks=[dict(type='PRSignalInVal')])
        cfg.train_cfg['val_interval'] = 4
        cfg.custom_imports = dict(imports=['tests.hooks.test_preemption_hook'],
                                  allow_failed_imports=False)
        config = str(tmp_path / f'val{run}.py')
        cfg.dump(config)
        proc = subprocess.Popen(  # tools/train.py, as a user runs it
            [sys.executable, osp.join(ROOT, 'tools', 'train.py'), config], cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        log, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, log[-3000:]
        assert 'PreemptionHook: SIGTERM received: saved ' in log, log[-3000:]
        assert 'Exception ignored' not in log and 'killed by signal' not in log, \
            f'run {run}: {log[-3000:]}'
