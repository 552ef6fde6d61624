"""tools/demo.py: a short run (``--iters`` below the warm-up) trains, evaluates and
exits cleanly (a real process on tiny synthetic data)."""
import os
import os.path as osp
import subprocess
import sys

import pytest
from mmengine.config import Config

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DEMO = osp.join(REPO, 'tools', 'demo.py')
sys.path.insert(0, osp.join(REPO, 'tools'))


@pytest.mark.parametrize('iters', [1, 4, 29, 30, 31, 300])
def test_set_iters_gives_schedulers_mmengine_accepts(iters):
    from demo import DEFAULT_CONFIG, set_iters
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import PARAM_SCHEDULERS
    import torch
    cfg = Config.fromfile(DEFAULT_CONFIG)
    set_iters(cfg, iters)
    wrapper = build_optim_wrapper(torch.nn.Linear(2, 1), dict(
        type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1)))
    for sched in cfg.param_scheduler:  # mmengine: "end should be larger than begin"
        PARAM_SCHEDULERS.build(dict(sched), default_args=dict(optimizer=wrapper))
    assert all(s['end'] <= iters for s in cfg.param_scheduler)
    if iters > 30:
        assert cfg.param_scheduler[0]['end'] == 30  # the warm-up kept


@pytest.mark.slow
def test_demo_with_4_iterations_runs_to_the_end(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO)
    done = subprocess.run([sys.executable, DEMO, '--iters', '4', '--train-frames', '8',
                           '--val-frames', '2', '--work-dir', str(tmp_path / 'work')],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert 'end should be larger than begin' not in done.stderr
    assert 'Traceback' not in done.stderr and 'Exception ignored' not in done.stderr, \
        done.stderr[-4000:]
    assert osp.isfile(tmp_path / 'work' / 'iter_4.pth')
