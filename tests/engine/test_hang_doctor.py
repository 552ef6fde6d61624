"""The hang doctor with real torchrun processes (gloo, CPU) and a rank asleep in its step.

- 2 ranks, rank 1 sleeps inside its training step: within the doctor's time (10 s here,
  far below the 5-minute collective timeout that would otherwise end the run) rank 1 is
  named as behind, every rank logs its Python stack, the job exits non-zero and no
  process of the launch (torchrun, its workers) is left;
- the diagnosis itself (which rank is behind) from published records;
- the config key: defaults, validation, the hook it adds.
"""
import os.path as osp
import sys

import pytest
from mmengine.config import Config

from mmdet3d_scaling.config.distributed import configure_distributed
from mmdet3d_scaling.engine.hang_doctor import EXIT_CODE, ranks_behind
from tests.engine.sleepy_toy import sleepy_config
from tests.launches import Launch, launch_env

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TRAIN = osp.join(REPO, 'tools', 'train.py')

SLEEPY_CONFIG = sleepy_config(backend='gloo', hang_timeout_s=10, timeout_minutes=5)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_rank_asleep_in_its_step_is_named_and_every_process_exits(tmp_path):
    config = tmp_path / 'sleepy.py'
    config.write_text(SLEEPY_CONFIG)
    work = tmp_path / 'work'
    launch = Launch([sys.executable, '-m', 'torch.distributed.run', '--standalone',
                     '--nproc_per_node=2', TRAIN, str(config), '--launcher', 'pytorch',
                     '--work-dir', str(work)], cwd=tmp_path, env=launch_env())
    log = launch.finish(timeout=240)  # the collective timeout (5 min) would be later
    assert launch.proc.returncode != 0, log[-4000:]
    assert len(launch.tree) >= 3  # torchrun and its 2 workers: all ended (finish)
    # the firing rank names rank 1 and why; every rank logs its stack
    assert 'rank(s) behind: 1 (' in log, log[-6000:]
    assert 'limit distributed.hang_timeout_s=10' in log
    assert 'long before the collective timeout (5 min)' in log
    assert 'Python stack of rank 0 (main thread)' in log
    assert 'Python stack of rank 1 (main thread)' in log
    assert 'sleepy_toy.py' in log and 'time.sleep(self.sleep_s)' in log  # rank 1's stack
    assert "train iteration 3: train_step" in log
    assert f'Exit code {EXIT_CODE}' in log
    assert not (work / '.train.lock').exists()  # released before exiting


def _record(iteration=3, seq=None, waiting=True):
    return dict(iteration=iteration, waiting=waiting,
                collective=None if seq is None else dict(seq=seq, op='gloo:allreduce'))


def test_ranks_behind_by_collectives_then_iteration_then_waiting():
    records = {0: _record(seq=12), 1: _record(seq=10, waiting=False), 2: _record(seq=12)}
    assert ranks_behind(records)[0] == [1]
    assert 'fewest collectives issued: #10' in ranks_behind(records)[1]
    records = {0: _record(iteration=5), 1: _record(iteration=4), 2: _record(iteration=5)}
    assert ranks_behind(records) == ([1], 'lowest iteration (4)')
    records = {0: _record(), 1: _record(waiting=False)}
    assert ranks_behind(records)[0] == [1]
    behind, why = ranks_behind({0: _record(), 1: _record()})
    assert behind == [] and 'every rank waits in a collective' in why


def _distributed_cfg(**distributed) -> Config:
    return Config(dict(launcher='pytorch', distributed=distributed,
                       env_cfg=dict(dist_cfg=dict(backend='gloo'))))


def test_hang_doctor_key_adds_the_hook_with_its_timeout():
    def doctor(timeout_s, collective_s=3600):
        return dict(type='HangDoctorHook', timeout_s=timeout_s,
                    collective_timeout_s=collective_s)
    cfg = configure_distributed(_distributed_cfg())
    assert doctor(300) in cfg.custom_hooks
    cfg = configure_distributed(_distributed_cfg(hang_timeout_s=42))
    assert doctor(42) in cfg.custom_hooks
    cfg = configure_distributed(_distributed_cfg(timeout_minutes=3))  # 300 s >= 180 s
    assert doctor(90, 180) in cfg.custom_hooks
    cfg = _distributed_cfg()  # by hand: its options kept, the collective timeout given
    cfg.custom_hooks = [dict(type='mmdet3d_scaling.HangDoctorHook', timeout_s=7)]
    assert configure_distributed(cfg).custom_hooks == [
        dict(type='mmdet3d_scaling.HangDoctorHook', timeout_s=7,
             collective_timeout_s=3600)]
    cfg = configure_distributed(_distributed_cfg(hang_timeout_s=None))
    assert not cfg.get('custom_hooks')
    single = Config(dict(launcher='none', distributed=dict()))
    assert not configure_distributed(single).get('custom_hooks')


@pytest.mark.parametrize('value, message', [
    ('5', "distributed.hang_timeout_s must be a positive number"),
    (0, "distributed.hang_timeout_s must be a positive number"),
    (3600, 'distributed.hang_timeout_s=3600 s is not below the collective timeout (3600 s'),
])
def test_bad_hang_timeout_is_named(value, message):
    with pytest.raises(ValueError, match=message.replace('(', r'\(')):
        configure_distributed(_distributed_cfg(hang_timeout_s=value))


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_rank_stuck_in_a_hook_is_named_so_and_its_loader_workers_end(tmp_path):
    """Rank 1 sleeps in another hook's before_train_iter (used to be labelled
    train_step); its loader workers are shielded by PreemptionHook (they used to ignore
    the doctor's terminate() and outlive the exit by seconds)."""
    text = sleepy_config(backend='gloo', hang_timeout_s=10, timeout_minutes=5,
                         sleep_s=0.0)
    text = text.replace('num_workers=0,', 'num_workers=1, persistent_workers=True,')
    text += ("custom_hooks = [dict(type='SleepyBeforeIterHook', sleep_rank=1, at=3), "
             "dict(type='PreemptionHook')]\n")
    config = tmp_path / 'stuck_hook.py'
    config.write_text(text)
    work = tmp_path / 'work'
    launch = Launch([sys.executable, '-m', 'torch.distributed.run', '--standalone',
                     '--nproc_per_node=2', TRAIN, str(config), '--launcher', 'pytorch',
                     '--work-dir', str(work)], cwd=tmp_path, env=launch_env())
    launch.proc.wait(timeout=240)
    left = launch._left_after(1.0)  # at most a second after the launcher's end
    log = launch.finish(timeout=60)
    assert launch.proc.returncode != 0, log[-4000:]
    # whichever rank's watchdog fires, rank 1 is named behind, in the hook's phase
    assert 'rank(s) behind: 1 (' in log, log[-6000:]
    assert "phase 'train iteration 3: before_train_iter hooks'" in log, log[-6000:]
    assert len(launch.tree) >= 5  # torchrun, 2 ranks, a loader worker each
    assert left == [], f'left running after the exit: {left}'
