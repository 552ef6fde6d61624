"""unwrap_model with torch's and mmengine's real wrappers."""
import torch
from mmengine.model import BaseTTAModel
from torch.nn.parallel import DataParallel

from mmdet3d_scaling.utils import unwrap_model
from tests.toy import ToyRegressor


class _TTA(BaseTTAModel):
    def merge_preds(self, data_samples_list):
        return data_samples_list[0]


def test_unwraps_model_wrappers_only():
    model = ToyRegressor()
    assert unwrap_model(model) is model
    assert unwrap_model(DataParallel(model)) is model  # a wrapper mmengine registers
    assert unwrap_model(DataParallel(DataParallel(model))) is model


def test_test_time_augmentation_only_when_asked():
    model = ToyRegressor()
    tta = _TTA(module=model)
    assert unwrap_model(tta) is tta
    assert unwrap_model(tta, tta=True) is model
    assert unwrap_model(DataParallel(tta), tta=True) is model


def test_a_plain_container_is_not_a_wrapper():
    inner = torch.nn.Linear(2, 2)
    box = torch.nn.Module()
    box.module = inner  # named like a wrapper's attribute, but not a wrapper
    assert unwrap_model(box) is box
