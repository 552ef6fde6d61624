"""runner_handoff: ``Runner.from_cfg`` builds a ScalingRunner only for configs that use
the plugin's keys, and leaves every other config to upstream."""
from mmengine.config import Config
from mmengine.logging import MMLogger
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

import mmdet3d_scaling  # noqa: F401
from mmdet3d_scaling import ScalingRunner
from mmdet3d_scaling.patches import patching
from mmdet3d_scaling.patches.fixes import runner_handoff
from tests.toy import toy_runner_cfg


def _cfg(tmp_path, **extra) -> Config:
    cfg = Config(toy_runner_cfg(tmp_path, max_iters=2))
    cfg.merge_from_dict(extra)
    return cfg


def test_is_a_declared_fix_applied_on_import():
    assert 'runner_handoff' in patching.applied()
    assert patching.PATCHES['runner_handoff'].kind == 'fixes'


def test_plugin_keys_go_to_scaling_runner(tmp_path):
    runner = Runner.from_cfg(_cfg(tmp_path, float32_matmul_precision='highest',
                                  scaling=dict(total_batch_size=4),
                                  default_scope='mmdet3d',  # our hooks' registry
                                  # a name of its own: mmengine reuses the scope of an
                                  # earlier runner built in the same second
                                  experiment_name=f'handoff_{tmp_path.name}'))
    assert type(runner) is ScalingRunner
    assert runner.cfg.get('scaling_plan') is not None  # the recipe ran


def test_a_config_without_plugin_keys_is_built_by_upstream(tmp_path):
    ours = Runner.from_cfg(_cfg(tmp_path / 'a'))
    theirs = runner_handoff._upstream_from_cfg(Runner, _cfg(tmp_path / 'a'))
    assert type(ours) is Runner
    assert ours.cfg.to_dict() == theirs.cfg.to_dict()
    assert [type(h) for h in ours.hooks] == [type(h) for h in theirs.hooks]


def test_says_which_keys_it_found(tmp_path, capsys):
    MMLogger.get_instance('handoff_test', log_level='INFO')  # the current logger
    Runner.from_cfg(_cfg(tmp_path, fp16=dict(loss_scale=512.)))
    out = capsys.readouterr()
    assert 'the config uses fp16: built by ScalingRunner' in out.out + out.err


def test_runner_type_selects_it_explicitly(tmp_path):
    runner = RUNNERS.build(_cfg(tmp_path, runner_type='ScalingRunner', launcher='auto'))
    assert type(runner) is ScalingRunner
    assert runner.launcher == 'none'  # 'auto' resolved by the preparation


def test_users_config_object_is_not_modified(tmp_path):
    cfg = _cfg(tmp_path, runner_type='ScalingRunner', launcher='auto')
    RUNNERS.build(cfg)
    assert cfg.launcher == 'auto'
