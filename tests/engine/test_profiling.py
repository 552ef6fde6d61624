"""summarize_profile on a real torch.profiler run (CPU)."""
import time

import torch
from torch.profiler import ProfilerActivity, profile

from mmdet3d_scaling.engine.profiling import summarize_profile


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
