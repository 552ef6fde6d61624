"""ScalingRunner: config keys prepared once, patch sets selected by the config and
printed, scoped type names, run-time plan changes through its methods."""
import json
import os
import subprocess
import sys

import pytest
from mmengine.config import Config
from mmengine.registry import RUNNERS

import mmdet3d_scaling  # noqa: F401
from mmdet3d_scaling import ScalingRunner
from tests.toy import toy_runner_cfg

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cfg(tmp_path, **extra) -> Config:
    cfg = Config(toy_runner_cfg(tmp_path, max_iters=2, runner_type='ScalingRunner'))
    cfg.merge_from_dict(extra)
    return cfg


def test_registered_in_mmengine_and_mmdet3d_runners():
    from mmdet3d.registry import RUNNERS as MMDET3D_RUNNERS
    assert RUNNERS.get('ScalingRunner') is ScalingRunner
    assert MMDET3D_RUNNERS.get('ScalingRunner') is ScalingRunner


@pytest.mark.slow
def test_speed_patches_only_when_the_config_selects_them(tmp_path):
    """In a fresh process: import applies no speed patch; a config's `patches` does, for
    its runner's build and train() only, and the start of the run lists them."""
    code = f'''
import json
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.registry import RUNNERS
import mmdet3d_scaling
from mmdet3d_scaling.patches import patching
from tests.toy import toy_runner_cfg
before = patching.applied()
cfg = Config(toy_runner_cfg({str(tmp_path)!r}, max_iters=2, runner_type='ScalingRunner',
                            log_level='INFO', patches=['speed']))
runner = RUNNERS.build(cfg)
built = patching.applied()
during = []
class Seen(Hook):
    def before_train_iter(self, runner, batch_idx, data_batch=None):
        during.append(patching.applied())
runner.register_hook(Seen())
runner.train()
print(json.dumps(dict(before=before, built=built, during=during[0],
                      skipped=list(patching.not_applied()), after=patching.applied())))
'''
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    from mmdet3d_scaling.patches import patching
    speed = set(patching.resolve(['speed']))
    assert not speed & set(result['before'])
    assert not speed & set(result['built'])
    assert speed - set(result['skipped']) <= set(result['during'])
    assert not speed & set(result['after'])
    logged = done.stdout + done.stderr
    assert 'patches in effect' in logged and 'roi_assign' in logged


def test_a_bad_patch_selection_names_it(tmp_path):
    with pytest.raises(ValueError, match="unknown patch or patch set 'fast'"):
        RUNNERS.build(_cfg(tmp_path, patches=['fast']))
    with pytest.raises(ValueError, match='patches must be a list'):
        RUNNERS.build(_cfg(tmp_path, patches=dict(speed=True)))


def test_auto_batch_size_needs_the_scaling_runner(tmp_path):
    from mmdet3d_scaling.engine.runner import require_scaling_runner
    from mmengine.runner import Runner
    runner = Runner(**toy_runner_cfg(tmp_path, max_iters=2))
    with pytest.raises(TypeError, match="runner_type='ScalingRunner'"):
        require_scaling_runner(runner, 'AutoBatchSizeHook')


def _logging_into(runner, lines: list) -> None:
    import logging
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())
    runner.logger.addHandler(handler)


@pytest.mark.slow
def test_resume_into_an_empty_work_dir_says_it_starts_from_iteration_0(tmp_path):
    work = tmp_path / 'fresh'
    runner = RUNNERS.build(_cfg(work, resume=True, log_level='INFO'))
    lines: list = []
    _logging_into(runner, lines)
    runner.train()
    log = '\n'.join(lines)
    assert f'--resume: no checkpoint found in {work} (no last_checkpoint file, no *.pth): ' \
           'training starts from iteration 0.' in log, log[-2000:]
    assert 'Auto resumed from the latest checkpoint None' not in log
    assert runner.iter == 2


@pytest.mark.slow
def test_resume_without_last_checkpoint_names_the_newest_checkpoint(tmp_path):
    work = tmp_path / 'run'
    RUNNERS.build(_cfg(work)).train()
    os.remove(work / 'last_checkpoint')
    with pytest.raises(FileNotFoundError) as err:
        RUNNERS.build(_cfg(work, resume=True)).train()
    assert f'{work} has no last_checkpoint file' in str(err.value)
    assert f'`--resume {work / "iter_2.pth"}`' in str(err.value)
