"""The config rewrites (mmdet3d_scaling.diagnostics.parity.overrides): a shortened
schedule keeps its shape, a moved data root moves every path derived from it."""
from pathlib import Path

import pytest
from mmengine.config import Config

from mmdet3d_scaling.diagnostics.parity.errors import ParityError
from mmdet3d_scaling.diagnostics.parity.overrides import (data_root_overrides,
                                                          schedule_overrides, walk)

DEMO = str(Path(__file__).resolve().parents[3] / 'configs' / 'demo' /
           'pointpillars_synthetic_kitti_cpu.py')


def test_schedule_keeps_its_shape_when_shortened():
    cfg = Config.fromfile(DEMO)  # 300 steps: warm-up 0-30, cosine 30-300 (T_max 270)
    out = schedule_overrides(cfg, 150)
    assert out['train_cfg.max_iters'] == 150
    assert out['default_hooks.checkpoint.interval'] == 150
    assert (out['param_scheduler.0.end'], out['param_scheduler.1.begin'],
            out['param_scheduler.1.end'], out['param_scheduler.1.T_max']) == (15, 15,
                                                                              150, 135)
    tiny = schedule_overrides(cfg, 2)  # no empty scheduler range
    assert (tiny['param_scheduler.0.end'], tiny['param_scheduler.1.begin'],
            tiny['param_scheduler.1.end']) == (1, 1, 2)

def test_schedule_of_an_epoch_based_config_is_refused():
    cfg = Config(dict(train_cfg=dict(type='EpochBasedTrainLoop', max_epochs=12)))
    with pytest.raises(ParityError, match='--iters needs an iteration-based config'):
        schedule_overrides(cfg, 10)

def test_data_root_moves_every_derived_path():
    cfg = Config.fromfile(DEMO)
    old = cfg.data_root
    cfg.merge_from_dict(data_root_overrides(cfg, '/elsewhere/kitti'))
    paths = [(p, v) for p, v in walk(cfg.to_dict(), '') if isinstance(v, str)]
    assert not [p for p, v in paths if v.startswith(old)]
    assert cfg.train_dataloader.dataset.dataset.data_root == '/elsewhere/kitti/'
    assert cfg.test_evaluator.ann_file == '/elsewhere/kitti/kitti_infos_val.pkl'
