"""strip_scope / type_name, and the config checks that use them."""
import pytest
from mmengine.config import Config

from mmdet3d_scaling.batch_size.config_step import configure_batch_size_search
from mmdet3d_scaling.hooks import GPUMonitorHook
from mmdet3d_scaling.utils import strip_scope, type_name


@pytest.mark.parametrize('name', ['GPUMonitorHook', 'mmdet3d.GPUMonitorHook',
                                  'mmdet3d_scaling.GPUMonitorHook'])
def test_scope_is_stripped(name):
    assert strip_scope(name) == 'GPUMonitorHook'
    assert type_name(name) == 'GPUMonitorHook'


def test_type_name_of_classes_and_other_values():
    assert type_name(GPUMonitorHook) == 'GPUMonitorHook'
    assert type_name(None) == 'None'
    assert type_name(3) == '3'  # names no type, and says what was there


@pytest.mark.parametrize('scoped', ['AutoBatchSizeHook', 'mmdet3d.AutoBatchSizeHook',
                                    'mmdet3d_scaling.AutoBatchSizeHook'])
def test_auto_batch_size_twice_is_an_error_whatever_the_scope(scoped):
    cfg = Config(dict(auto_batch_size=dict(margin=0.2),
                      custom_hooks=[dict(type=scoped)]))
    with pytest.raises(ValueError, match='AutoBatchSizeHook is in custom_hooks and also'):
        configure_batch_size_search(cfg)
