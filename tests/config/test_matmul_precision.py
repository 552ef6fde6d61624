"""``float32_matmul_precision``: applied by prepare_config, bad values are clear errors."""
import pytest
import torch
from mmengine.config import Config

from mmdet3d_scaling.config import prepare_config
from mmdet3d_scaling.config.matmul_precision import configure_matmul_precision


@pytest.fixture
def restore_precision():
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


def test_prepare_config_sets_the_process_precision(restore_precision):
    torch.set_float32_matmul_precision('highest')
    prepare_config(Config(dict(float32_matmul_precision='high')))
    assert torch.get_float32_matmul_precision() == 'high'


def test_absent_key_changes_nothing(restore_precision):
    torch.set_float32_matmul_precision('medium')
    configure_matmul_precision(Config(dict()))
    assert torch.get_float32_matmul_precision() == 'medium'


def test_bad_value_names_it_and_the_choices(restore_precision):
    with pytest.raises(ValueError, match=r"float32_matmul_precision='tf32'.*'high'"):
        configure_matmul_precision(Config(dict(float32_matmul_precision='tf32')))
