"""Timing of one call for the micro-benchmarks: median wall time, CUDA-synchronised."""
import statistics
import time
from typing import Callable

import torch


def timed(fn: Callable[[], object], device: str, repeats: int, warmup: int = 1) -> float:
    """Median seconds of ``fn`` over ``repeats`` calls, after ``warmup`` untimed ones;
    on ``device='cuda'`` each call is timed from a synchronised GPU to its end."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device == 'cuda':
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == 'cuda':
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
