"""``float32_matmul_precision``: checked by prepare_config (which leaves the process
alone), in effect during the runner's commands and restored after them; bad values are
clear errors."""
import pytest
import torch
from mmengine.config import Config

from mmdet3d_scaling.config import prepare_config
from mmdet3d_scaling.config.matmul_precision import check_matmul_precision
from mmdet3d_scaling.engine.run_settings import apply_run_settings, run_settings


@pytest.fixture
def restore_precision():
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


def test_prepare_config_leaves_the_process_alone(restore_precision):
    torch.set_float32_matmul_precision('highest')
    cfg = prepare_config(Config(dict(float32_matmul_precision='high')))
    assert torch.get_float32_matmul_precision() == 'highest'
    apply_run_settings(cfg)  # the start-up check: still no change
    assert torch.get_float32_matmul_precision() == 'highest'
    with run_settings(cfg):
        assert torch.get_float32_matmul_precision() == 'high'
    assert torch.get_float32_matmul_precision() == 'highest'


def test_absent_key_changes_nothing(restore_precision):
    torch.set_float32_matmul_precision('medium')
    with run_settings(Config(dict())):
        assert torch.get_float32_matmul_precision() == 'medium'
    assert torch.get_float32_matmul_precision() == 'medium'


def test_bad_value_names_it_and_the_choices(restore_precision):
    with pytest.raises(ValueError, match=r"float32_matmul_precision='tf32'.*'high'"):
        check_matmul_precision(Config(dict(float32_matmul_precision='tf32')))
    with pytest.raises(ValueError, match=r"float32_matmul_precision='tf32'"):
        apply_run_settings(Config(dict(float32_matmul_precision='tf32')))  # at start-up
