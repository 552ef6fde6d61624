"""summarize_profile and the call-site tables on real torch.profiler runs (CPU; GPU
where there is one)."""
import time

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from mmdet3d_scaling.diagnostics.profiling import (profiler_records_python_frames,
                                              summarize_profile)

# torch 2.11 + CUDA 13 (the H200 machine) records no Python frames with with_stack
needs_frames = pytest.mark.skipif(not profiler_records_python_frames(),
                                  reason="this torch's profiler records no Python frames")


def test_summary_counts_per_iteration():
    x = torch.randn(128, 128)
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(4):
            (x @ x).relu_()
    summary = summarize_profile(prof, iters=4, wall_s=time.perf_counter() - t0)
    assert summary['iterations'] == 4
    assert summary['wall_ms_per_iter'] > 0
    mm = next(op for op in summary['top_cpu'] if op['name'] == 'aten::mm')
    assert mm['calls_per_iter'] == 1.0 and mm['ms_per_iter'] > 0
    assert summary['host_syncs_per_iter'] == 0 and summary['host_syncs_by_call'] == {}
    assert summary['comm_cpu_ms_per_iter'] == 0 and summary['comm_kernel_ms_per_iter'] == 0
    assert summary['top_device'] == []  # no GPU activity recorded


def _reads_back(x):
    total = 0.0
    for i in range(3):
        total += x[i].item()  # a host wait on a GPU tensor
    return total + float(torch.nonzero(x > 0).numel())


@needs_frames
def test_host_waits_are_traced_to_their_call_site():
    x = torch.randn(16)
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        for _ in range(2):
            _reads_back(x)
    sites = summarize_profile(prof, iters=2, wall_s=1.0)['sync_sites']
    by_op = {s['op']: s for s in sites}
    item = by_op['aten::_local_scalar_dense']
    assert item['calls_per_iter'] == 3.0
    assert 'test_profiling.py' in item['site'] and item['site'].endswith(': _reads_back')
    assert by_op['aten::nonzero']['calls_per_iter'] == 1.0
    assert not any('/torch/' in s['site'] for s in sites)


def test_no_stacks_no_sites():
    x = torch.randn(16)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _reads_back(x)
    assert summarize_profile(prof, iters=1, wall_s=1.0)['sync_sites'] == []



def _launches(x):
    y = x @ x  # one aten::mm here
    return y.relu_() @ x  # and one here


@needs_frames
def test_calls_are_counted_by_site_and_by_name():
    """driver_call_sites with a pattern that matches CPU operators (a CPU profile has no
    CUDA calls): per-iteration totals by name, and by the innermost Python frame."""
    import re

    from mmdet3d_scaling.diagnostics.profiling import DRIVER_CALL, driver_call_sites
    x = torch.randn(32, 32)
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        for _ in range(3):
            _launches(x)
            torch.mm(x, x)  # a third mm, from the test itself
    calls = driver_call_sites(prof, iters=3, pattern=re.compile(r'^aten::(mm|relu_)$'))
    assert calls['by_call'] == {'aten::mm': 3.0, 'aten::relu_': 1.0}
    assert calls['calls_per_iter'] == 4.0 and calls['python_frames'] is True
    top = calls['sites'][0]
    assert top['site'].endswith(': _launches') and 'test_profiling.py' in top['site']
    assert top['by_call'] == {'aten::mm': 2.0, 'aten::relu_': 1.0}
    assert calls['sites'][1]['by_call'] == {'aten::mm': 1.0}
    assert calls['sites'][1]['site'].endswith(': test_calls_are_counted_by_site_and_by_name')
    # the default pattern is the CUDA API's names: nothing on a CPU-only profile
    assert driver_call_sites(prof, iters=3)['calls_per_iter'] == 0
    assert DRIVER_CALL.match('cudaLaunchKernel') and DRIVER_CALL.match('cuLaunchKernelEx')
    assert DRIVER_CALL.match('cudaMemcpyAsync') and not DRIVER_CALL.match('aten::cudnn')



def test_gpu_work_of_a_cpu_profile_is_empty():
    from mmdet3d_scaling.diagnostics.profiling import device_work_sites
    x = torch.randn(32, 32)
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        _launches(x)
    work = device_work_sites(prof, iters=1)
    assert work == dict(python_frames=profiler_records_python_frames(), work_per_iter=0.0,
                        linked_per_iter={}, linked_share=0.0, sites=[])


@needs_frames
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a GPU')
def test_gpu_work_is_filed_under_the_operator_call_site():
    from mmdet3d_scaling.diagnostics.profiling import device_work_sites
    x = torch.randn(32, 32, device='cuda')
    _launches(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 with_stack=True) as prof:
        for _ in range(2):
            _launches(x)
            x.sum().item()  # a copy to the host, from the test itself
        torch.cuda.synchronize()
    work = device_work_sites(prof, iters=2)
    sites = {s['site'].rsplit(': ', 1)[-1]: s for s in work['sites']}
    assert sites['_launches']['by_kind']['kernel'] >= 3  # two matmuls, one relu
    here = sites['test_gpu_work_is_filed_under_the_operator_call_site']['by_kind']
    assert here['copy_to_host'] == 1.0
    assert 0 < work['linked_share'] <= 1.0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a GPU')
def test_gpu_time_is_counted_once():
    """The operator and its kernel both carry the kernel's time: the summary counts the
    kernels only."""
    x = torch.randn(2048, 2048, device='cuda')
    x @ x
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(4):
            x @ x
        torch.cuda.synchronize()
    events = list(prof.key_averages())
    kernels = sum(e.self_device_time_total for e in events
                  if not str(e.device_type).endswith('CPU'))
    every_event = sum(e.self_device_time_total for e in events)
    summary = summarize_profile(prof, iters=4, wall_s=1.0)
    assert kernels > 0 and every_event > 1.5 * kernels  # the double count exists
    assert summary['device_kernel_ms_per_iter'] == pytest.approx(kernels / 1000 / 4)
    assert not any(k['name'].startswith('aten::') for k in summary['top_device'])
