"""NVML sampling: the averaging of the driver's samples, and a real device where there
is one."""
from collections import namedtuple

import pytest
import torch

from mmdet3d_scaling.monitoring.nvml_sampler import mean_new_samples, open_nvml

# the fields of NVML's nvmlSample_t / nvmlValue_t that the sampler reads
Sample = namedtuple('Sample', 'timeStamp sampleValue')
Value = namedtuple('Value', 'uiVal dVal')


def test_mean_of_the_samples_newer_than_the_last_read():
    samples = [Sample(100, Value(10, 0.0)), Sample(200, Value(30, 0.0)),
               Sample(300, Value(50, 0.0))]
    assert mean_new_samples(1, samples, 0) == (30.0, 300)  # 1: unsigned int values
    assert mean_new_samples(1, samples, 100) == (40.0, 300)
    assert mean_new_samples(1, samples, 300) == (None, 300)  # nothing new
    doubles = [Sample(5, Value(0, 12.5))]
    assert mean_new_samples(0, doubles, 0) == (12.5, 5)  # 0: double values


@pytest.mark.skipif(torch.cuda.is_available(), reason='checks the no-NVML path')
def test_no_sampler_without_a_usable_nvml():
    # without a driver: pynvml missing, or its nvmlInit fails; both give None
    assert open_nvml(torch.device('cuda', 0)) is None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')
def test_reads_the_current_device():
    sampler = open_nvml(torch.device('cuda', torch.cuda.current_device()))
    if sampler is None:
        pytest.skip('nvidia-ml-py is not installed')
    try:
        torch.ones(1024, device='cuda').sum().item()
        values = sampler.read()
    finally:
        sampler.close()
    assert set(values) | set(sampler.dropped) == {'util_pct', 'nvml_mem_used_mb',
                                                  'power_w', 'temp_c'}
    assert values.get('nvml_mem_used_mb', 1.0) > 0
    assert 0 <= values.get('util_pct', 0.0) <= 100
