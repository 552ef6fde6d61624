"""utils/cuda_local_memory.py: what the driver keeps for local memory, and giving it back."""
import subprocess
import sys

import pytest
import torch

from mmdet3d_scaling.utils import cuda_local_memory

from ..devices import needs_cuda


def test_nothing_to_report_or_give_back_without_a_cuda_context():
    """A process that has not used CUDA (or has no driver) gets None / False, no error."""
    # the module alone, by its path: the package's import would take ten seconds more
    code = ('import importlib.util as u; '
            f's = u.spec_from_file_location("m", {cuda_local_memory.__file__!r}); '
            'm = u.module_from_spec(s); s.loader.exec_module(m); '
            'print(m.stack_size_bytes(), m.kept_bytes(), m.release())')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out == ['None', 'None', 'False']


@needs_cuda
@pytest.mark.cuda
def test_mmcvs_strided_sparse_conv_makes_the_driver_keep_memory_until_released():
    from mmcv.ops import SparseConv3d, SparseConvTensor
    conv = SparseConv3d(4, 16, 3, stride=2, padding=1).cuda()
    coords = torch.tensor([[0, 1, 2, 3], [0, 4, 5, 6]], dtype=torch.int32, device='cuda')
    feats = torch.randn(2, 4, device='cuda')
    assert cuda_local_memory.release()
    assert cuda_local_memory.stack_size_bytes() == cuda_local_memory.DEFAULT_STACK_BYTES
    with torch.no_grad():
        conv(SparseConvTensor(feats, coords, [8, 8, 8], 1))
    torch.cuda.synchronize()
    per_thread = cuda_local_memory.stack_size_bytes()
    assert per_thread >= 4096 * 4 * 4  # the index kernel's 4096 x 4 int array
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    assert cuda_local_memory.kept_bytes() == (
        per_thread * props.multi_processor_count * props.max_threads_per_multi_processor)
    assert cuda_local_memory.release()
    assert cuda_local_memory.stack_size_bytes() == cuda_local_memory.DEFAULT_STACK_BYTES
