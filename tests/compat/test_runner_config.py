from mmengine.config import Config
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

import mmdet3d_scaling  # noqa: F401
from tests.toy import toy_runner_cfg


def _cfg(tmp_path, **extra) -> Config:
    cfg = Config(toy_runner_cfg(tmp_path, max_iters=2))
    cfg.merge_from_dict(extra)
    return cfg


def test_from_cfg_prepares_the_config(tmp_path):
    # 'auto' is not an mmengine launcher: only the plugin's preparation resolves it.
    runner = Runner.from_cfg(_cfg(tmp_path, launcher='auto'))
    assert runner.launcher == 'none'
    assert runner.cfg.launcher == 'none'


def test_runner_type_path_is_prepared_too(tmp_path):
    runner = RUNNERS.build(_cfg(tmp_path, launcher='auto', runner_type='Runner'))
    assert runner.launcher == 'none'


def test_wrapping_is_idempotent():
    from mmdet3d_scaling.compat import runner_config
    assert runner_config.apply() is False  # already applied on import
    assert getattr(Runner.from_cfg.__func__, '_mmdet3d_scaling_wrapped', False)


def test_users_config_object_is_not_modified(tmp_path):
    cfg = _cfg(tmp_path, launcher='auto')
    Runner.from_cfg(cfg)
    assert cfg.launcher == 'auto'
