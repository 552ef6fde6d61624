"""The devices a test runs on: the CPU always, a CUDA GPU where there is one."""
import pytest
import torch

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU')
DEVICES = ['cpu', pytest.param('cuda', marks=needs_cuda)]
