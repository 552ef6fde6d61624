"""Fixtures of the batch size tests: a real PointPillars, its optimizer and a few
frames of synthetic KITTI, built once per test module."""
import pytest
import torch
from mmengine.dataset import pseudo_collate

from mmdet3d_scaling.batch_size.samples import LargestSampleBatches
from tests.auto_batch_size_common import build_parts, data_root_for_tests, demo_config


@pytest.fixture(scope='module')
def data_root(tmp_path_factory):
    return data_root_for_tests(str(tmp_path_factory.mktemp('abs_data')))


@pytest.fixture(scope='module')
def shared(data_root, tmp_path_factory):
    """One model, optimizer and dataset for the module: every search must leave them
    as it found them, which the tests check."""
    cfg = demo_config(data_root, str(tmp_path_factory.mktemp('abs_work')))
    torch.manual_seed(0)
    model, optim_wrapper, dataset = build_parts(cfg)
    batches = LargestSampleBatches(dataset, pseudo_collate, num_candidates=4)
    return model, optim_wrapper, dataset, batches


@pytest.fixture
def parts(shared):
    model, optim_wrapper, dataset, _ = shared
    yield model, optim_wrapper, dataset
    assert not model._forward_pre_hooks, 'a test left a memory probe attached'
